//===- TranslateToCpp.cpp - a sharded step as C++ over fsdp_rt ------------===//
//
// Prints each step function of a sharded, scheduled module as a C++ function
// over the fsdp runtime (runtime/include/fsdp_rt/Step.h) and ATen. The IR is
// already scheduled, so the printer decides nothing: one statement per op, in
// order. ATen calls go through the boxed dispatcher by schema name, so every
// captured operator lowers without a table of signatures.
//
//   %w = fsdp.wait %f : !fsdp.future<tensor<10x4xf32>>
//   %y = fsdp.aten "aten::mm" (%x, %w) : ...
//
// becomes
//
//   std::vector<at::Tensor> r3 = ctx.wait(f2);
//   at::Tensor v3 = r3[0];
//   at::Tensor v4 = fsdp_rt::aten(ctx, "aten::mm", "", {v1, v3})[0].toTensor();
//
// The collectives' groups (grid shape and axes) are listed once per module so
// the runtime can create them before the first step.
//
// Test: test/Target/fsdp-to-cpp.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Target/Cpp.h"

#include "fsdp/Analysis/Step.h"
#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Support/AtenOpName.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <map>
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace mlir::fsdp;

namespace {

std::string cppString(StringRef text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

/// at::ScalarType for an MLIR element type, or empty if there is none.
std::string scalarType(Type type) {
  if (type.isF32()) return "at::kFloat";
  if (type.isBF16()) return "at::kBFloat16";
  if (type.isF16()) return "at::kHalf";
  if (type.isF64()) return "at::kDouble";
  if (type.isInteger(1)) return "at::kBool";
  if (type.isSignlessInteger(64)) return "at::kLong";
  if (type.isSignlessInteger(32)) return "at::kInt";
  if (type.isSignlessInteger(16)) return "at::kShort";
  if (type.isSignlessInteger(8)) return "at::kChar";
  if (type.isUnsignedInteger(8)) return "at::kByte";
  return "";
}

/// Communication groups by key ("grid:axes"): the grid's shape and the axes.
using GroupTable = std::map<std::string, std::pair<SmallVector<int64_t>, SmallVector<int16_t>>>;

/// A symbol name as part of a C++ identifier.
std::string identifier(StringRef symbol) {
  std::string out;
  for (char c : symbol)
    out += llvm::isAlnum(c) ? c : '_';
  return out;
}

class StepPrinter {
public:
  StepPrinter(raw_ostream &os, GroupTable &groups) : os(os), groups(groups) {}

  LogicalResult print(func::FuncOp func) {
    os << "// @" << func.getSymName() << "\n";
    os << "static fsdp_rt::StepResult step_" << identifier(func.getSymName())
       << "(fsdp_rt::StepContext &ctx, const std::vector<at::Tensor> &batch) {\n";
    for (auto [index, arg] : llvm::enumerate(func.getArguments()))
      os << "  at::Tensor " << name(arg) << " = batch.at(" << index << ");\n";
    for (Operation &op : func.getBody().front())
      if (failed(print(op)))
        return failure();
    os << "}\n\n";
    return success();
  }

private:
  std::string name(Value value) {
    auto it = names.find(value);
    if (it != names.end())
      return it->second;
    return names[value] = "v" + std::to_string(names.size());
  }

  std::string group(Operation *op) {
    auto gridRef = op->getAttrOfType<FlatSymbolRefAttr>("grid");
    auto axes = op->getAttrOfType<DenseI16ArrayAttr>("grid_axes").asArrayRef();
    auto grid = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(op, gridRef);
    std::string key;
    llvm::raw_string_ostream(key) << gridRef.getValue() << ":"
                                  << llvm::join(llvm::map_range(axes, [](int16_t a) {
                                       return std::to_string(a);
                                     }), ",");
    groups[key] = {SmallVector<int64_t>(grid.getShape()), SmallVector<int16_t>(axes)};
    return cppString(key);
  }

  static std::string shape(Type type) {
    auto tensor = cast<RankedTensorType>(type);
    return "{" + llvm::join(llvm::map_range(tensor.getShape(), [](int64_t d) {
             return std::to_string(d);
           }), ", ") + "}";
  }

  std::string list(ValueRange values) {
    return "{" + llvm::join(llvm::map_range(values, [&](Value v) { return name(v); }), ", ") + "}";
  }

  /// One `args` entry of an fsdp.aten as a c10::IValue expression.
  FailureOr<std::string> argument(Attribute arg, AtenOp op) {
    if (auto integer = dyn_cast<IntegerAttr>(arg)) {
      if (integer.getType().isIndex())
        return "c10::IValue(" + name(op.getInputs()[integer.getInt()]) + ")";
      if (integer.getType().isInteger(1))
        return std::string(integer.getValue().getBoolValue() ? "c10::IValue(true)" : "c10::IValue(false)");
      return "c10::IValue(int64_t{" + std::to_string(integer.getInt()) + "})";
    }
    if (auto real = dyn_cast<FloatAttr>(arg)) {
      double value = real.getValueAsDouble();
      std::string text;
      if (std::isnan(value))
        text = "std::numeric_limits<double>::quiet_NaN()";
      else if (std::isinf(value))
        text = value > 0 ? "std::numeric_limits<double>::infinity()"
                         : "-std::numeric_limits<double>::infinity()";
      else
        llvm::raw_string_ostream(text) << llvm::format("%a", value);
      return "c10::IValue(double{" + text + "})";
    }
    if (isa<UnitAttr>(arg))
      return std::string("c10::IValue()");
    if (auto text = dyn_cast<StringAttr>(arg))
      return "fsdp_rt::literal(" + cppString(text.getValue()) + ")";
    if (auto type = dyn_cast<TypeAttr>(arg)) {
      std::string scalar = scalarType(type.getValue());
      if (scalar.empty())
        return op.emitOpError("fsdp-to-cpp: no ATen dtype for ") << type.getValue();
      return "c10::IValue(static_cast<int64_t>(" + scalar + "))";
    }
    if (auto items = dyn_cast<ArrayAttr>(arg)) {
      bool tensors = !items.empty() && llvm::all_of(items, [](Attribute item) {
        auto integer = dyn_cast<IntegerAttr>(item);
        return integer && integer.getType().isIndex();
      });
      SmallVector<std::string> parts;
      for (Attribute item : items) {
        if (tensors) {
          parts.push_back(name(op.getInputs()[cast<IntegerAttr>(item).getInt()]));
          continue;
        }
        auto integer = dyn_cast<IntegerAttr>(item);
        if (!integer)
          return op.emitOpError("fsdp-to-cpp: only integer and tensor lists lower, got ") << items;
        parts.push_back(std::to_string(integer.getInt()));
      }
      std::string type = tensors ? "at::Tensor" : "int64_t";
      return "c10::IValue(std::vector<" + type + ">{" + llvm::join(parts, ", ") + "})";
    }
    return op.emitOpError("fsdp-to-cpp: cannot lower argument ") << arg;
  }

  LogicalResult printAten(AtenOp op) {
    std::optional<AtenOpName> callee = AtenOpName::parse(op.getCallee());
    SmallVector<std::string> args;
    if (ArrayAttr list = op.getArgsAttr()) {
      for (Attribute arg : list) {
        FailureOr<std::string> text = argument(arg, op);
        if (failed(text))
          return failure();
        args.push_back(*text);
      }
    } else {
      for (Value input : op.getInputs())
        args.push_back("c10::IValue(" + name(input) + ")");
    }
    std::string call = "fsdp_rt::aten(ctx, " + cppString((callee->nameSpace + "::" + callee->name).str()) +
                       ", " + cppString(callee->overload) + ", {" + llvm::join(args, ", ") + "})";
    if (op.getOutputs().empty()) {
      os << "  " << call << ";\n";
      return success();
    }
    std::string results = "r" + std::to_string(temporaries++);
    os << "  std::vector<c10::IValue> " << results << " = " << call << ";\n";
    for (auto [index, output] : llvm::enumerate(op.getOutputs()))
      if (isa<RankedTensorType>(output.getType()))
        os << "  at::Tensor " << name(output) << " = " << results << ".at(" << index
           << ").toTensor();\n";
    return success();
  }

  LogicalResult print(Operation &op) {
    if (auto read = dyn_cast<GetParamOp>(op)) {
      os << "  at::Tensor " << name(read.getResult()) << " = ctx.param(" << cppString(read.getName())
         << ");\n";
      return success();
    }
    if (auto read = dyn_cast<GetBufferOp>(op)) {
      os << "  at::Tensor " << name(read.getResult()) << " = ctx.buffer(" << cppString(read.getName())
         << ");\n";
      return success();
    }
    if (auto read = dyn_cast<GetAccumulatedGradOp>(op)) {
      os << "  at::Tensor " << name(read.getResult()) << " = ctx.accumulatedGrad("
         << cppString(read.getName()) << ");\n";
      return success();
    }
    if (auto aten = dyn_cast<AtenOp>(op))
      return printAten(aten);
    if (auto cast = dyn_cast<CastOp>(op)) {
      std::string scalar = scalarType(cast.getResult().getType().getElementType());
      if (scalar.empty())
        return cast.emitOpError("fsdp-to-cpp: no ATen dtype for the result");
      os << "  at::Tensor " << name(cast.getResult()) << " = " << name(cast.getInput()) << ".to("
         << scalar << ");\n";
      return success();
    }
    if (auto loss = dyn_cast<LossOp>(op)) {
      os << "  ctx.setLoss(" << name(loss.getLoss()) << ");\n";
      return success();
    }
    if (auto grads = dyn_cast<GradientsOp>(op)) {
      SmallVector<std::string> params;
      for (Attribute param : grads.getParams())
        params.push_back(cppString(cast<FlatSymbolRefAttr>(param).getValue()));
      os << "  ctx.setGradients({" << llvm::join(params, ", ") << "}, " << list(grads.getGrads())
         << ");\n";
      return success();
    }
    if (auto start = dyn_cast<AllGatherStartOp>(op)) {
      SmallVector<std::string> shapes;
      for (Type type : start.getFuture().getType().getResults())
        shapes.push_back(shape(type));
      Type wire = cast<RankedTensorType>(start.getFuture().getType().getResults().front()).getElementType();
      os << "  fsdp_rt::Pending " << name(start.getFuture()) << " = ctx.allGather(" << group(&op)
         << ", " << list(start.getInputs()) << ", {" << llvm::join(shapes, ", ") << "}, "
         << scalarType(wire) << ");\n";
      return success();
    }
    if (isa<ReduceScatterStartOp, AllReduceStartOp>(op)) {
      bool scatter = isa<ReduceScatterStartOp>(op);
      SmallVector<std::string> shapes, dtypes;
      for (Type type : futureTypes(&op)) {
        shapes.push_back(shape(type));
        dtypes.push_back(scalarType(cast<RankedTensorType>(type).getElementType()));
      }
      auto reduction = op.getAttrOfType<shard::ReductionKindAttr>("reduction").getValue();
      auto factor = [&](StringRef attr) {
        auto value = op.getAttrOfType<FloatAttr>(attr);
        std::string text = "1.0";
        if (value)
          llvm::raw_string_ostream(text = "") << llvm::format("%a", value.getValueAsDouble());
        return text;
      };
      os << "  fsdp_rt::Pending " << name(op.getResult(0)) << " = ctx."
         << (scatter ? "reduceScatter(" : "allReduce(") << group(&op) << ", "
         << list(op.getOperands()) << ", {" << llvm::join(shapes, ", ") << "}, {"
         << llvm::join(dtypes, ", ") << "}, "
         << scalarType(op.getAttrOfType<TypeAttr>("reduce_dtype").getValue()) << ", "
         << (reduction == shard::ReductionKind::Average ? "fsdp_rt::Reduction::Average"
             : reduction == shard::ReductionKind::Sum  ? "fsdp_rt::Reduction::Sum"
             : reduction == shard::ReductionKind::Max  ? "fsdp_rt::Reduction::Max"
             : reduction == shard::ReductionKind::Min  ? "fsdp_rt::Reduction::Min"
                                                       : "fsdp_rt::Reduction::Product")
         << ", " << factor("pre_divide") << ", " << factor("post_divide") << ");\n";
      return success();
    }
    if (auto wait = dyn_cast<WaitOp>(op)) {
      std::string results = "r" + std::to_string(temporaries++);
      os << "  std::vector<at::Tensor> " << results << " = ctx.wait(" << name(wait.getFuture())
         << ");\n";
      for (auto [index, result] : llvm::enumerate(wait.getResults()))
        os << "  at::Tensor " << name(result) << " = " << results << ".at(" << index << ");\n";
      return success();
    }
    if (auto reshard = dyn_cast<ReshardOp>(op)) {
      // Dropping the references frees the storage once no view holds it.
      for (Value buffer : reshard.getBuffers())
        os << "  " << name(buffer) << " = at::Tensor();\n";
      return success();
    }
    if (auto slice = dyn_cast<AllSliceOp>(op)) {
      os << "  at::Tensor " << name(slice.getResult()) << " = ctx.allSlice(" << group(&op) << ", "
         << name(slice.getInput()) << ", " << slice.getResult().getType().getDimSize(0) << ");\n";
      return success();
    }
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      os << "  return ctx.finish();\n";
      return success();
    }
    return op.emitOpError("fsdp-to-cpp: cannot lower this operation");
  }

  raw_ostream &os;
  GroupTable &groups;
  DenseMap<Value, std::string> names;
  unsigned temporaries = 0;
};

} // namespace

LogicalResult mlir::fsdp::translateToCpp(ModuleOp module, raw_ostream &os) {
  SmallVector<Step> steps = collectSteps(module);
  if (steps.empty())
    return module.emitError("fsdp-to-cpp: no training step (a function with fsdp.loss) to lower");
  std::string body;
  llvm::raw_string_ostream bodyStream(body);
  GroupTable groups;
  StepPrinter printer(bodyStream, groups);
  for (Step &step : steps) {
    if (!step.func->hasAttr("fsdp.collective_hash"))
      return step.func.emitError("fsdp-to-cpp: run fsdp-verify-schedule (or the sharding "
                                 "pipeline) first; the runtime checks its collective hash");
    if (failed(printer.print(step.func)))
      return failure();
  }
  os << "// Generated by fsdp-translate --fsdp-to-cpp. Do not edit.\n";
  os << "#include \"fsdp_rt/Step.h\"\n\n";
  os << "#include <cmath>\n#include <limits>\n\n";
  os << body;
  os << "FSDP_RT_MODULE(\n";
  os << "  /*groups=*/{";
  for (auto &[key, spec] : groups)
    os << "\n    {" << cppString(key) << ", {"
       << llvm::join(llvm::map_range(spec.first, [](int64_t d) { return std::to_string(d); }), ", ")
       << "}, {"
       << llvm::join(llvm::map_range(spec.second, [](int16_t a) { return std::to_string(a); }), ", ")
       << "}},";
  os << "},\n  /*steps=*/{";
  for (Step &step : steps)
    os << "\n    {" << cppString(step.func.getSymName()) << ", &step_" << identifier(step.func.getSymName())
       << ", "
       << cppString(step.func->getAttrOfType<StringAttr>("fsdp.collective_hash").getValue())
       << "},";
  os << "})\n";
  return success();
}
