//===- Json.h - the JSON reader of the runtime ------------------*- C++ -*-===//
//
// Programs arrive as JSON (fsdp-translate --fsdp-to-program). The torch wheel
// ships no JSON library and the GPU machines install nothing, so the runtime
// reads JSON itself: a strict RFC 8259 reader (UTF-8 strings, \u escapes
// including surrogate pairs and NUL, integers kept exact) whose errors give
// the byte offset. No dependencies beyond the standard library.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_JSON_H
#define FSDP_RT_JSON_H

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp_rt::json {

class Value;
using Array = std::vector<Value>;
using Object = std::map<std::string, Value>;

/// A malformed document, or a value of the wrong kind where a program needs
/// another; the message says what and where.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Value {
public:
  enum class Kind { Null, Bool, Int, Double, String, Array, Object };

  Value() = default;
  static Value parse(std::string_view text);

  Kind kind() const { return kind_; }
  bool isNull() const { return kind_ == Kind::Null; }
  bool isNumber() const { return kind_ == Kind::Int || kind_ == Kind::Double; }

  bool asBool() const;
  int64_t asInt() const;
  double asDouble() const; // ints convert
  const std::string &asString() const;
  const Array &asArray() const;
  const Object &asObject() const;

  /// Member `key` of an object; throws naming the key when it is missing.
  const Value &at(const std::string &key) const;
  /// Member `key`, or null when missing.
  const Value *find(const std::string &key) const;

private:
  friend class Parser;
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
};

} // namespace fsdp_rt::json

#endif // FSDP_RT_JSON_H
