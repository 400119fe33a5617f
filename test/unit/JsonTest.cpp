//===- JsonTest.cpp - the runtime's JSON reader ---------------------------===//

#include "fsdp_rt/Json.h"

#include <gtest/gtest.h>

#include <clocale>
#include <cmath>
#include <cstdlib>
#include <limits>

using fsdp_rt::json::Error;
using fsdp_rt::json::Value;

namespace {

std::string errorOf(const std::string &text) {
  try {
    Value::parse(text);
  } catch (const Error &error) {
    return error.what();
  }
  return "";
}

TEST(Json, ReadsEveryKind) {
  Value doc = Value::parse(R"( {"n": null, "t": true, "f": false, "i": -42, "d": 2.5e-1,
                                "s": "x", "a": [1, [2]], "o": {"k": {}}} )");
  EXPECT_TRUE(doc.at("n").isNull());
  EXPECT_TRUE(doc.at("t").asBool());
  EXPECT_FALSE(doc.at("f").asBool());
  EXPECT_EQ(doc.at("i").asInt(), -42);
  EXPECT_EQ(doc.at("d").asDouble(), 0.25);
  EXPECT_EQ(doc.at("s").asString(), "x");
  EXPECT_EQ(doc.at("a").asArray().at(1).asArray().at(0).asInt(), 2);
  EXPECT_TRUE(doc.at("o").at("k").asObject().empty());
  EXPECT_EQ(doc.find("missing"), nullptr);
}

TEST(Json, IntegersStayExactAtTheLimits) {
  EXPECT_EQ(Value::parse("9223372036854775807").asInt(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Value::parse("-9223372036854775808").asInt(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(Value::parse("9007199254740993").asInt(), 9007199254740993); // not a double
  EXPECT_NE(errorOf("9223372036854775808").find("integer out of range"), std::string::npos);
  EXPECT_NE(errorOf("-9223372036854775809").find("integer out of range"), std::string::npos);
}

TEST(Json, RealsRoundTripAndIntsWiden) {
  EXPECT_EQ(Value::parse("0.1").asDouble(), 0.1);
  EXPECT_EQ(Value::parse("1.7976931348623157e308").asDouble(), std::numeric_limits<double>::max());
  EXPECT_EQ(Value::parse("4.9406564584124654e-324").asDouble(), std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(Value::parse("-0.0").asDouble(), 0.0);
  EXPECT_TRUE(std::signbit(Value::parse("-0.0").asDouble()));
  EXPECT_EQ(Value::parse("3").asDouble(), 3.0);
  EXPECT_NE(errorOf("1e400").find("number out of range"), std::string::npos);
  EXPECT_THROW(Value::parse("2.5").asInt(), Error); // a real is not an integer
}

TEST(Json, NumbersIgnoreTheLocale) {
  // Under a locale whose decimal point is ',', strtod read "0.5" as 0. The
  // locale is compiled into a scratch folder (LOCPATH), as few machines
  // install one.
  std::string folder = ::testing::TempDir() + "fsdp-json-locale";
  std::string build = "localedef -i de_DE -f UTF-8 " + folder + "/de_DE.UTF-8 >/dev/null 2>&1";
  if (std::system("command -v localedef >/dev/null") != 0)
    GTEST_SKIP() << "localedef is not installed";
  std::system(("mkdir -p " + folder).c_str());
  ASSERT_EQ(std::system(build.c_str()) >> 8 <= 1, true) << build; // 1: warnings only
  setenv("LOCPATH", folder.c_str(), 1);
  ASSERT_NE(std::setlocale(LC_NUMERIC, "de_DE.UTF-8"), nullptr);
  ASSERT_EQ(std::localeconv()->decimal_point, std::string(","));
  EXPECT_EQ(Value::parse("0.5").asDouble(), 0.5);
  EXPECT_EQ(Value::parse("-1.25e2").asDouble(), -125.0);
  std::setlocale(LC_NUMERIC, "C");
}

TEST(Json, StringsDecodeEscapesAndUtf8) {
  EXPECT_EQ(Value::parse(R"("a\"b\\c\/d\b\f\n\r\t")").asString(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(Value::parse(R"("\u0000")").asString(), std::string(1, '\0'));
  EXPECT_EQ(Value::parse(R"("\u00e9\u20ac")").asString(), "\xC3\xA9\xE2\x82\xAC");
  EXPECT_EQ(Value::parse(R"("\ud83c\udfd6")").asString(), "\xF0\x9F\x8F\x96");
  EXPECT_EQ(Value::parse("\"\xF0\x9F\x8F\x96\"").asString(), "\xF0\x9F\x8F\x96");
}

TEST(Json, MalformedDocumentsNameWhatAndWhere) {
  struct Case {
    const char *text, *message;
  } cases[] = {
      {"", "unexpected end of input at byte 0"},
      {"{\"a\": 1,}", "expected a string key at byte 8"},
      {"{\"a\": 1, \"a\": 2}", "duplicate key"},
      {"[1 2]", "expected ',' or ']' at byte 3"},
      {"01", "unexpected text after the document at byte 1"},
      {"1.", "expected digits after '.'"},
      {"1e", "expected exponent digits"},
      {"-", "unexpected character"},
      {"+1", "unexpected character"},
      {".5", "unexpected character"},
      {"nan", "unexpected character"},
      {"\"abc", "unterminated string"},
      {"\"a\nb\"", "control character in string"},
      {"\"\\x\"", "bad escape '\\x'"},
      {"\"\\u12\"", "truncated \\u escape"},
      {"\"\\u12zz\"", "bad hex digit"},
      {"\"\\ud83c\"", "unpaired surrogate"},
      {"\"\\udfd6\"", "unpaired surrogate"},
      {"tru", "unexpected character"},
      {"[] []", "unexpected text after the document"},
  };
  for (const Case &c : cases)
    EXPECT_NE(errorOf(c.text).find(c.message), std::string::npos)
        << "'" << c.text << "' gave '" << errorOf(c.text) << "'";
}

TEST(Json, NestingIsBounded) {
  EXPECT_NO_THROW(Value::parse(std::string(200, '[') + std::string(200, ']')));
  EXPECT_NE(errorOf(std::string(100000, '[')).find("nesting deeper than 256"), std::string::npos);
}

TEST(Json, WrongKindsAndMissingMembersAreErrors) {
  Value doc = Value::parse(R"({"i": 1, "s": "x"})");
  EXPECT_THROW(doc.at("s").asInt(), Error);
  EXPECT_THROW(doc.at("i").asString(), Error);
  EXPECT_THROW(doc.at("i").asArray(), Error);
  EXPECT_THROW(doc.at("i").find("k"), Error);
  try {
    doc.at("missing");
    FAIL() << "no error";
  } catch (const Error &error) {
    EXPECT_STREQ(error.what(), "JSON: missing member \"missing\"");
  }
}

} // namespace
