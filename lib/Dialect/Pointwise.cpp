//===- Pointwise.cpp - ATen calls a generated kernel computes per element -===//
//
// One row per operator: the schema arguments it reads, in order, and the
// C++ expression of one element. Expressions compute in float (the kernel's
// `T` is float for f32, bf16 and f16 tensors, as ATen's opmath type);
// a kernel's source carries the helper functions its expressions call
// (fsdp_sigmoid, ...; lib/Target/Program/PointwiseKernel.cpp).
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/Pointwise.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <variant>

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// What a schema argument of a pointwise operator may be.
enum class Param {
  Tensor,         ///< an operand
  TensorOrNumber, ///< an operand, or a number literal (a wrapped scalar)
  Number,         ///< a number literal
  Approximate,    ///< gelu's `approximate`: "none" or "tanh"
  Sizes,          ///< expand's sizes: a list of integers (the result type says them)
  Flag,           ///< a bool literal the element does not depend on
  Condition,      ///< a bool operand: a comparison's result in the same kernel, read as 0 or 1
};

/// One argument as the expression sees it.
struct Arg {
  std::string text;              ///< the element's expression, or the literal in C++
  std::optional<double> number;  ///< the literal's value
  std::string word;              ///< a string literal
};

struct Rule {
  StringLiteral callee;
  SmallVector<Param, 3> params;
  /// Defaults of trailing arguments the call may leave out (last first
  /// missing; nullopt: required). Strings default to "none".
  SmallVector<std::optional<double>, 3> defaults;
  std::function<std::string(ArrayRef<Arg>)> print;
  /// A comparison: its result is a bool tensor (read by a condition inside
  /// the kernel as 0 or 1), its tensor operands any one kernel float type.
  bool comparison = false;
};

std::string call(StringRef function, const Arg &a) { return (function + "(" + a.text + ")").str(); }

std::string scaled(const Arg &alpha, const Arg &b) {
  return alpha.number && *alpha.number == 1.0 ? b.text : alpha.text + " * " + b.text;
}

std::string power(const Arg &a, const Arg &exponent) {
  double e = *exponent.number;
  if (e == 1.0)
    return a.text;
  if (e == 2.0)
    return "(" + a.text + " * " + a.text + ")";
  if (e == 3.0)
    return "(" + a.text + " * " + a.text + " * " + a.text + ")";
  if (e == 0.5)
    return call("sqrtf", a);
  if (e == -1.0)
    return "(1.0f / " + a.text + ")";
  if (e == -0.5)
    return call("rsqrtf", a);
  return "powf(" + a.text + ", " + exponent.text + ")";
}

const std::vector<Rule> &rules() {
  using P = Param;
  static const std::vector<Rule> table = {
      {"aten::add.Tensor", {P::Tensor, P::TensorOrNumber, P::Number}, {std::nullopt, std::nullopt, 1.0},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " + " + scaled(a[2], a[1]) + ")"; }},
      {"aten::sub.Tensor", {P::Tensor, P::TensorOrNumber, P::Number}, {std::nullopt, std::nullopt, 1.0},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " - " + scaled(a[2], a[1]) + ")"; }},
      {"aten::add.Scalar", {P::Tensor, P::Number, P::Number}, {std::nullopt, std::nullopt, 1.0},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " + " + scaled(a[2], a[1]) + ")"; }},
      {"aten::sub.Scalar", {P::Tensor, P::Number, P::Number}, {std::nullopt, std::nullopt, 1.0},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " - " + scaled(a[2], a[1]) + ")"; }},
      {"aten::mul.Tensor", {P::Tensor, P::TensorOrNumber}, {},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " * " + a[1].text + ")"; }},
      {"aten::mul.Scalar", {P::Tensor, P::Number}, {},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " * " + a[1].text + ")"; }},
      {"aten::div.Tensor", {P::Tensor, P::TensorOrNumber}, {},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " / " + a[1].text + ")"; }},
      {"aten::div.Scalar", {P::Tensor, P::Number}, {},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " / " + a[1].text + ")"; }},
      {"aten::pow.Tensor_Scalar", {P::Tensor, P::Number}, {},
       [](ArrayRef<Arg> a) { return power(a[0], a[1]); }},
      {"aten::neg", {P::Tensor}, {}, [](ArrayRef<Arg> a) { return "(-" + a[0].text + ")"; }},
      {"aten::reciprocal", {P::Tensor}, {}, [](ArrayRef<Arg> a) { return "(1.0f / " + a[0].text + ")"; }},
      {"aten::rsqrt", {P::Tensor}, {}, [](ArrayRef<Arg> a) { return call("rsqrtf", a[0]); }},
      {"aten::sqrt", {P::Tensor}, {}, [](ArrayRef<Arg> a) { return call("sqrtf", a[0]); }},
      {"aten::exp", {P::Tensor}, {}, [](ArrayRef<Arg> a) { return call("expf", a[0]); }},
      {"aten::tanh", {P::Tensor}, {}, [](ArrayRef<Arg> a) { return call("tanhf", a[0]); }},
      {"aten::sigmoid", {P::Tensor}, {}, [](ArrayRef<Arg> a) { return call("fsdp_sigmoid", a[0]); }},
      {"aten::silu", {P::Tensor}, {},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " * " + call("fsdp_sigmoid", a[0]) + ")"; }},
      {"aten::relu", {P::Tensor}, {}, [](ArrayRef<Arg> a) { return call("fsdp_relu", a[0]); }},
      {"aten::silu_backward", {P::Tensor, P::Tensor}, {},
       [](ArrayRef<Arg> a) { return "fsdp_silu_backward(" + a[0].text + ", " + a[1].text + ")"; }},
      {"aten::sigmoid_backward", {P::Tensor, P::Tensor}, {},
       [](ArrayRef<Arg> a) {
         return "(" + a[0].text + " * (1.0f - " + a[1].text + ") * " + a[1].text + ")";
       }},
      {"aten::tanh_backward", {P::Tensor, P::Tensor}, {},
       [](ArrayRef<Arg> a) {
         return "(" + a[0].text + " * (1.0f - " + a[1].text + " * " + a[1].text + "))";
       }},
      {"aten::threshold_backward", {P::Tensor, P::Tensor, P::Number}, {},
       [](ArrayRef<Arg> a) {
         return "(" + a[1].text + " <= " + a[2].text + " ? 0.0f : " + a[0].text + ")";
       }},
      {"aten::ne.Scalar", {P::Tensor, P::Number}, {},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " != " + a[1].text + " ? 1.0f : 0.0f)"; }, /*comparison=*/true},
      {"aten::where.self", {P::Condition, P::Tensor, P::Tensor}, {},
       [](ArrayRef<Arg> a) { return "(" + a[0].text + " != 0.0f ? " + a[1].text + " : " + a[2].text + ")"; }},
      // A broadcast: each element reads its input's element at the broadcast index.
      {"aten::expand", {P::Tensor, P::Sizes, P::Flag}, {std::nullopt, std::nullopt, 0.0},
       [](ArrayRef<Arg> a) { return a[0].text; }},
      {"aten::gelu", {P::Tensor, P::Approximate}, {std::nullopt, std::nullopt},
       [](ArrayRef<Arg> a) {
         return (a[1].word == "tanh" ? "fsdp_gelu_tanh(" : "fsdp_gelu(") + a[0].text + ")";
       }},
      {"aten::gelu_backward", {P::Tensor, P::Tensor, P::Approximate}, {std::nullopt, std::nullopt, std::nullopt},
       [](ArrayRef<Arg> a) {
         return (a[2].word == "tanh" ? "fsdp_gelu_tanh_backward(" : "fsdp_gelu_backward(") + a[0].text + ", " +
                a[1].text + ")";
       }},
  };
  return table;
}

const Rule *ruleOf(StringRef callee) {
  for (const Rule &rule : rules())
    if (rule.callee == callee)
      return &rule;
  return nullptr;
}

/// A C++ float literal ("1e-05f", "2.0f").
std::string floatLiteral(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  std::string text = buffer;
  if (text.find_first_of(".e") == std::string::npos)
    text += ".0";
  return text + "f";
}

bool isKernelFloat(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  return tensor && isKernelElementType(tensor.getElementType());
}

/// The schema argument at `position`: an operand index, a literal, or
/// nothing (left to its default).
Attribute argumentAt(AtenOp op, unsigned position) {
  if (ArrayAttr args = op.getArgsAttr())
    return position < args.size() ? args[position] : Attribute();
  if (position < op.getInputs().size())
    return IntegerAttr::get(IndexType::get(op.getContext()), position);
  return {};
}

std::optional<int64_t> operandIndex(Attribute attr) {
  auto integer = dyn_cast_or_null<IntegerAttr>(attr);
  if (integer && integer.getType().isIndex())
    return integer.getInt();
  return std::nullopt;
}

std::optional<double> numberOf(Attribute attr) {
  if (auto real = dyn_cast_or_null<FloatAttr>(attr))
    return real.getValueAsDouble();
  auto integer = dyn_cast_or_null<IntegerAttr>(attr);
  if (integer && !integer.getType().isIndex() && !integer.getType().isInteger(1))
    return static_cast<double>(integer.getInt());
  return std::nullopt;
}

/// The arguments of `op` as `rule` reads them, or the reason they do not fit.
std::variant<SmallVector<Arg>, std::string> argumentsOf(AtenOp op, const Rule &rule,
                                                        ArrayRef<std::string> operands) {
  size_t given = op.getArgsAttr() ? op.getArgsAttr().size() : op.getInputs().size();
  if (given > rule.params.size())
    return "it has " + std::to_string(given) + " arguments, " + rule.callee.str() + " takes " +
           std::to_string(rule.params.size());
  SmallVector<Arg> args;
  for (auto [position, param] : llvm::enumerate(rule.params)) {
    Attribute attr = argumentAt(op, position);
    std::string where = "argument " + std::to_string(position);
    Arg arg;
    if (!attr) {
      std::optional<double> fallback =
          position < rule.defaults.size() ? rule.defaults[position] : std::optional<double>();
      if (param == Param::Approximate) {
        arg.word = "none";
      } else if (param == Param::Sizes) {
        return where + " is missing";
      } else if (fallback) {
        arg.number = fallback;
        arg.text = floatLiteral(*fallback);
      } else {
        return where + " is missing";
      }
      args.push_back(arg);
      continue;
    }
    if (std::optional<int64_t> index = operandIndex(attr)) {
      if (param == Param::Condition) {
        auto condition = dyn_cast<RankedTensorType>(op.getInputs()[*index].getType());
        if (!condition || !condition.getElementType().isInteger(1))
          return where + " is not a bool tensor";
        if (!operands.empty())
          arg.text = operands[*index];
        args.push_back(arg);
        continue;
      }
      if (param != Param::Tensor && param != Param::TensorOrNumber)
        return where + " must be a literal";
      Type operand = op.getInputs()[*index].getType();
      if (rule.comparison ? !isKernelFloat(operand)
                          : !isKernelFloat(operand) ||
                                cast<RankedTensorType>(operand).getElementType() !=
                                    cast<RankedTensorType>(op->getResult(0).getType()).getElementType())
        return where + (rule.comparison ? " is not an f32, bf16 or f16 tensor"
                                        : " is not a tensor of the result's element type");
      if (!operands.empty())
        arg.text = operands[*index];
    } else if (param == Param::Condition) {
      return where + " is not a bool tensor";
    } else if (param == Param::Sizes) {
      auto sizes = dyn_cast<ArrayAttr>(attr);
      if (!sizes || !llvm::all_of(sizes, [](Attribute size) { return isa<IntegerAttr>(size); }))
        return where + " is not a list of sizes";
    } else if (param == Param::Flag) {
      auto flag = dyn_cast<IntegerAttr>(attr);
      if (!flag || !flag.getType().isInteger(1))
        return where + " is not a bool";
    } else if (param == Param::Approximate) {
      auto word = dyn_cast<StringAttr>(attr);
      if (!word || (word.getValue() != "none" && word.getValue() != "tanh"))
        return where + " must be \"none\" or \"tanh\"";
      arg.word = word.getValue().str();
    } else if (std::optional<double> number = numberOf(attr)) {
      if (param == Param::Tensor)
        return where + " must be a tensor";
      if (!std::isfinite(*number))
        return where + " is not a finite number";
      arg.number = number;
      arg.text = floatLiteral(*number);
    } else {
      return where + " is not " + (param == Param::Tensor ? "a tensor" : "a number");
    }
    args.push_back(arg);
  }
  return args;
}

std::string shapeText(ArrayRef<int64_t> shape) {
  std::string text = "[";
  for (auto [i, dim] : llvm::enumerate(shape))
    text += (i ? ", " : "") + std::to_string(dim);
  return text + "]";
}

} // namespace

bool mlir::fsdp::isKernelElementType(Type type) { return type.isF32() || type.isBF16() || type.isF16(); }

std::optional<SmallVector<int64_t>> mlir::fsdp::broadcastShape(ArrayRef<int64_t> a, ArrayRef<int64_t> b) {
  SmallVector<int64_t> out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1)
      return std::nullopt;
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

std::string mlir::fsdp::pointwiseRefusal(AtenOp op) {
  const Rule *rule = ruleOf(op.getCallee());
  if (!rule)
    return "'" + op.getCallee().str() + "' is not an elementwise operator a kernel can compute";
  if (op.getRandom())
    return "a random call";
  auto result = op->getNumResults() == 1 ? dyn_cast<RankedTensorType>(op->getResult(0).getType()) : nullptr;
  if (rule->comparison ? !result || !result.getElementType().isInteger(1) : !isKernelFloat(result))
    return rule->comparison ? "its result is not one bool tensor" : "its result is not one f32, bf16 or f16 tensor";
  auto args = argumentsOf(op, *rule, {});
  if (auto *why = std::get_if<std::string>(&args))
    return *why;
  for (Value input : op.getInputs()) {
    ArrayRef<int64_t> shape = cast<RankedTensorType>(input.getType()).getShape();
    if (broadcastShape(shape, result.getShape()) != SmallVector<int64_t>(result.getShape()))
      return "an operand of shape " + shapeText(shape) + " does not broadcast to the result's " +
             shapeText(result.getShape());
  }
  return "";
}

std::string mlir::fsdp::pointwiseExpression(AtenOp op, ArrayRef<std::string> operands) {
  const Rule *rule = ruleOf(op.getCallee());
  auto args = argumentsOf(op, *rule, operands);
  return rule->print(std::get<SmallVector<Arg>>(args));
}
