//===- Json.cpp - a strict JSON reader ------------------------------------===//

#include "fsdp_rt/Json.h"

#include <charconv>

namespace fsdp_rt::json {

namespace {
const char *kindName(Value::Kind kind) {
  switch (kind) {
  case Value::Kind::Null: return "null";
  case Value::Kind::Bool: return "a boolean";
  case Value::Kind::Int:
  case Value::Kind::Double: return "a number";
  case Value::Kind::String: return "a string";
  case Value::Kind::Array: return "an array";
  case Value::Kind::Object: return "an object";
  }
  return "?";
}

[[noreturn]] void wrongKind(const char *wanted, Value::Kind got) {
  throw Error(std::string("JSON: expected ") + wanted + ", got " + kindName(got));
}

// Nesting deeper than this is not a program; refusing it bounds the stack.
constexpr int kMaxDepth = 256;
} // namespace

class Parser {
public:
  explicit Parser(std::string_view text) : text(text) {}

  Value document() {
    Value value = parseValue(0);
    skipSpace();
    if (pos != text.size())
      fail("unexpected text after the document");
    return value;
  }

private:
  [[noreturn]] void fail(const std::string &what) {
    throw Error("JSON: " + what + " at byte " + std::to_string(pos));
  }

  void skipSpace() {
    while (pos < text.size() &&
           (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }

  bool consume(std::string_view word) {
    if (text.substr(pos, word.size()) != word)
      return false;
    pos += word.size();
    return true;
  }

  Value parseValue(int depth) {
    if (depth > kMaxDepth)
      fail("nesting deeper than " + std::to_string(kMaxDepth));
    skipSpace();
    if (pos >= text.size())
      fail("unexpected end of input");
    Value value;
    char c = text[pos];
    if (c == '{') {
      ++pos;
      value.kind_ = Value::Kind::Object;
      value.object_ = std::make_shared<Object>();
      skipSpace();
      if (consume("}"))
        return value;
      while (true) {
        skipSpace();
        if (pos >= text.size() || text[pos] != '"')
          fail("expected a string key");
        std::string key = parseString();
        skipSpace();
        if (!consume(":"))
          fail("expected ':'");
        Value member = parseValue(depth + 1);
        if (!value.object_->emplace(std::move(key), std::move(member)).second)
          fail("duplicate key");
        skipSpace();
        if (consume("}"))
          return value;
        if (!consume(","))
          fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++pos;
      value.kind_ = Value::Kind::Array;
      value.array_ = std::make_shared<Array>();
      skipSpace();
      if (consume("]"))
        return value;
      while (true) {
        value.array_->push_back(parseValue(depth + 1));
        skipSpace();
        if (consume("]"))
          return value;
        if (!consume(","))
          fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      value.kind_ = Value::Kind::String;
      value.string_ = parseString();
      return value;
    }
    if (consume("true") || consume("false")) {
      value.kind_ = Value::Kind::Bool;
      value.bool_ = c == 't';
      return value;
    }
    if (consume("null"))
      return value;
    return parseNumber();
  }

  Value parseNumber() {
    size_t start = pos;
    if (pos < text.size() && text[pos] == '-')
      ++pos;
    auto digits = [&] {
      size_t first = pos;
      while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9')
        ++pos;
      return pos - first;
    };
    if (pos >= text.size() || !(text[pos] >= '0' && text[pos] <= '9'))
      fail("unexpected character");
    if (text[pos] == '0')
      ++pos;
    else
      digits();
    bool integral = true;
    if (pos < text.size() && text[pos] == '.') {
      ++pos;
      integral = false;
      if (!digits())
        fail("expected digits after '.'");
    }
    if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
      ++pos;
      integral = false;
      if (pos < text.size() && (text[pos] == '+' || text[pos] == '-'))
        ++pos;
      if (!digits())
        fail("expected exponent digits");
    }
    // from_chars: no locale can turn "0.5" into 0 (strtod reads the decimal
    // point of LC_NUMERIC, which a host process may have set).
    const char *first = text.data() + start, *last = text.data() + pos;
    Value value;
    if (integral) {
      auto [end, error] = std::from_chars(first, last, value.int_);
      if (error == std::errc::result_out_of_range)
        fail("integer out of range");
      if (error != std::errc() || end != last)
        fail("malformed number");
      value.kind_ = Value::Kind::Int;
      return value;
    }
    auto [end, error] = std::from_chars(first, last, value.double_);
    if (error == std::errc::result_out_of_range)
      fail("number out of range");
    if (error != std::errc() || end != last)
      fail("malformed number");
    value.kind_ = Value::Kind::Double;
    return value;
  }

  unsigned hex4() {
    if (pos + 4 > text.size())
      fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      char h = text[pos++];
      code <<= 4;
      if (h >= '0' && h <= '9') code |= h - '0';
      else if (h >= 'a' && h <= 'f') code |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') code |= h - 'A' + 10;
      else fail("bad hex digit in \\u escape");
    }
    return code;
  }

  static void appendUtf8(std::string &out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string parseString() {
    ++pos; // opening quote
    std::string out;
    while (true) {
      if (pos >= text.size())
        fail("unterminated string");
      char c = text[pos++];
      if (c == '"')
        return out;
      if (static_cast<unsigned char>(c) < 0x20)
        fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos >= text.size())
        fail("unterminated escape");
      char e = text[pos++];
      switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        unsigned code = hex4();
        if (code >= 0xD800 && code < 0xDC00) {
          if (!consume("\\u"))
            fail("unpaired surrogate");
          unsigned low = hex4();
          if (low < 0xDC00 || low >= 0xE000)
            fail("unpaired surrogate");
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        } else if (code >= 0xDC00 && code < 0xE000) {
          fail("unpaired surrogate");
        }
        appendUtf8(out, code);
        break;
      }
      default:
        fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  std::string_view text;
  size_t pos = 0;
};

Value Value::parse(std::string_view text) { return Parser(text).document(); }

bool Value::asBool() const {
  if (kind_ != Kind::Bool)
    wrongKind("a boolean", kind_);
  return bool_;
}

int64_t Value::asInt() const {
  if (kind_ != Kind::Int)
    wrongKind("an integer", kind_);
  return int_;
}

double Value::asDouble() const {
  if (kind_ == Kind::Int)
    return static_cast<double>(int_);
  if (kind_ != Kind::Double)
    wrongKind("a number", kind_);
  return double_;
}

const std::string &Value::asString() const {
  if (kind_ != Kind::String)
    wrongKind("a string", kind_);
  return string_;
}

const Array &Value::asArray() const {
  if (kind_ != Kind::Array)
    wrongKind("an array", kind_);
  return *array_;
}

const Object &Value::asObject() const {
  if (kind_ != Kind::Object)
    wrongKind("an object", kind_);
  return *object_;
}

const Value &Value::at(const std::string &key) const {
  const Value *member = find(key);
  if (!member)
    throw Error("JSON: missing member \"" + key + "\"");
  return *member;
}

const Value *Value::find(const std::string &key) const {
  const Object &object = asObject();
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

} // namespace fsdp_rt::json
