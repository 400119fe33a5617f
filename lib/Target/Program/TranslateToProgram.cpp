//===- TranslateToProgram.cpp - a sharded module as an fsdp_rt program ----===//
//
// Writes what the prebuilt runtime (libfsdp_rt) executes: a JSON document with
// the manifest the Python driver needs (groups with their member ranks,
// parameters with their shard layout, buffers, steps) and one instruction
// per op of each function, in order. The IR is already scheduled and its
// lifetimes planned, so the printer decides nothing: values become numbered
// slots, fsdp.release/fsdp.reshard become drops of slots.
//
//   %w = fsdp.wait %f : !fsdp.future<tensor<10x4xf32>>
//   %y = fsdp.aten "aten::mm" (%x, %w) : ...
//   fsdp.release %x : ...
//
// becomes
//
//   {"op": "wait", "future": 0, "results": [3]},
//   {"op": "aten", "name": "aten::mm", "overload": "",
//    "args": [{"tensor": 1}, {"tensor": 3}], "results": [4], "loc": "model.py:12"},
//   {"op": "release", "values": [1]}
//
// Every name reaches the program as a JSON string (llvm::json escapes it),
// so no name can become code. Element types go by their MLIR spelling and
// must be in fsdp_rt/ElementTypes.h, the table the runtime reads too.
//
// Test: test/Target/fsdp-to-program.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Target/Program.h"
#include "PointwiseKernel.h"

#include "fsdp/Analysis/Step.h"
#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Support/AtenOpName.h"
#include "fsdp_rt/ElementTypes.h"
#include "fsdp_rt/ProgramFormat.h"
#include "fsdp_rt/ShardLayout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/JSON.h"

#include <cmath>

using namespace mlir;
using namespace mlir::fsdp;
namespace json = llvm::json;
using Kind = fsdp_rt::InstructionKind;

namespace {

/// An instruction's `op` spelling, from the table the runtime reads too.
std::string opText(Kind kind) { return std::string(fsdp_rt::opName(kind)); }

/// The element type's name in the shared table, or failure on `anchor`.
FailureOr<std::string> elementTypeName(Type type, Operation *anchor) {
  std::string name;
  llvm::raw_string_ostream(name) << type;
  if (!fsdp_rt::lookupElementType(name))
    return anchor->emitOpError("fsdp-to-program: element type ")
           << type << " has no runtime equivalent (fsdp_rt/ElementTypes.h)";
  return name;
}

json::Array shapeOf(Type type) {
  json::Array shape;
  for (int64_t dim : cast<RankedTensorType>(type).getShape())
    shape.push_back(dim);
  return shape;
}

std::string locationText(Location loc) {
  if (auto fileLoc = dyn_cast<FileLineColLoc>(loc))
    return (fileLoc.getFilename().str() + ":" + std::to_string(fileLoc.getLine()));
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location inner : fused.getLocations())
      if (std::string text = locationText(inner); !text.empty())
        return text;
  if (auto named = dyn_cast<NameLoc>(loc))
    return locationText(named.getChildLoc());
  return "";
}

/// Communication groups by key: the grid's shape, the axes, and the world
/// ranks of every group (row-major grid coordinates, members in axis order).
class GroupTable {
public:
  std::string key(Operation *user, FlatSymbolRefAttr gridRef, ArrayRef<int16_t> axes) {
    std::string key = (gridRef.getValue() + ":").str();
    for (auto [i, axis] : llvm::enumerate(axes))
      key += (i ? "," : "") + std::to_string(axis);
    if (!groups.count(key)) {
      auto grid = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(user, gridRef);
      groups[key] = describe(key, gridRef.getValue(), grid.getShape(), axes);
    }
    return key;
  }

  json::Array toJson() {
    json::Array out;
    for (auto &[key, group] : groups)
      out.push_back(json::Value(json::Object(group)));
    return out;
  }

private:
  static json::Object describe(StringRef key, StringRef grid, ArrayRef<int64_t> shape,
                               ArrayRef<int16_t> axes) {
    int64_t world = 1;
    for (int64_t dim : shape)
      world *= dim;
    auto coordinates = [&](int64_t rank) {
      SmallVector<int64_t> coords(shape.size());
      for (int64_t d = shape.size() - 1; d >= 0; --d) {
        coords[d] = rank % shape[d];
        rank /= shape[d];
      }
      return coords;
    };
    // Group of a rank: the ranks that differ from it only on `axes`.
    std::map<SmallVector<int64_t>, json::Array> byFixedCoords;
    std::vector<SmallVector<int64_t>> order;
    for (int64_t rank = 0; rank < world; ++rank) {
      SmallVector<int64_t> fixed = coordinates(rank);
      for (int16_t axis : axes)
        fixed[axis] = 0;
      if (!byFixedCoords.count(fixed))
        order.push_back(fixed);
      byFixedCoords[fixed].push_back(rank);
    }
    json::Array members;
    for (auto &fixed : order)
      members.push_back(std::move(byFixedCoords[fixed]));
    json::Array gridShape, axisList;
    for (int64_t dim : shape)
      gridShape.push_back(dim);
    for (int16_t axis : axes)
      axisList.push_back(axis);
    int64_t size = world / std::max<int64_t>(1, (int64_t)order.size());
    return json::Object{{"key", key.str()},
                        {"grid", grid.str()},
                        {"grid_shape", std::move(gridShape)},
                        {"axes", std::move(axisList)},
                        {"size", size},
                        {"members", std::move(members)}};
  }

  llvm::MapVector<std::string, json::Object, std::map<std::string, unsigned>> groups;
};

/// Generated kernels, each once: fused chains that compute the same over
/// tensors laid out alike (80 identical layers' RMSNorm tails) share one
/// entry.
class KernelTable {
public:
  FailureOr<int64_t> index(PointwiseOp op) {
    FailureOr<KernelLayout> layout = pointwiseKernelLayout(op, strides);
    if (failed(layout))
      return failure();
    FailureOr<std::string> dtype =
        elementTypeName(cast<RankedTensorType>(op.getResults().front().getType()).getElementType(), op);
    if (failed(dtype))
      return failure();
    auto operands = [](ArrayRef<KernelOperandLayout> list) {
      json::Array out;
      for (const KernelOperandLayout &operand : list)
        out.push_back(json::Object{{"shape", json::Array(operand.shape)},
                                   {"strides", json::Array(operand.strides)},
                                   {"steps", json::Array(operand.steps)}});
      return out;
    };
    constexpr llvm::StringLiteral kNamePlaceholder = "@FSDP_KERNEL@";
    json::Object entry{{"source", pointwiseElementSource(op, kNamePlaceholder)},
                       {"element_type", *dtype},
                       {"extents", json::Array(layout->extents)},
                       {"inputs", operands(layout->inputs)},
                       {"outputs", operands(layout->outputs)},
                       {"vector", layout->vector},
                       {"block", layout->block},
                       {"grid", layout->grid}};
    std::string key;
    llvm::raw_string_ostream(key) << json::Value(json::Object(entry));
    auto [it, added] = indexOf.try_emplace(key, kernels.size());
    if (added) {
      std::string name = "fsdp_pointwise_" + std::to_string(kernels.size());
      std::string source = entry.getString("source")->str();
      source.replace(source.find(kNamePlaceholder), kNamePlaceholder.size(), name);
      entry["source"] = source;
      entry["name"] = name;
      kernels.push_back(std::move(entry));
    }
    return it->second;
  }

  json::Array &toJson() { return kernels; }

private:
  std::map<std::string, int64_t> indexOf;
  json::Array kernels;
  EagerStrides strides;
};

class FunctionPrinter {
public:
  FunctionPrinter(GroupTable &groups, KernelTable &kernels) : groups(groups), kernels(kernels) {}

  FailureOr<json::Object> print(func::FuncOp func) {
    json::Array inputs;
    for (BlockArgument arg : func.getArguments()) {
      FailureOr<json::Value> type = tensorSpec(arg.getType(), func);
      if (failed(type))
        return failure();
      inputs.push_back(slot(arg));
      inputSpecs.push_back(std::move(*type));
    }
    json::Array instructions;
    for (Operation &op : func.getBody().front()) {
      FailureOr<std::optional<json::Object>> instruction = print(op);
      if (failed(instruction))
        return failure();
      if (*instruction)
        instructions.push_back(std::move(**instruction));
    }
    json::Object out{{"name", func.getSymName()},
                     {"inputs", std::move(inputs)},
                     {"input_types", std::move(inputSpecs)},
                     {"slots", static_cast<int64_t>(slots.size())},
                     {"futures", static_cast<int64_t>(futures.size())},
                     {"instructions", std::move(instructions)}};
    return out;
  }

private:
  int64_t slot(Value value) { return slots.try_emplace(value, slots.size()).first->second; }
  int64_t future(Value value) { return futures.try_emplace(value, futures.size()).first->second; }

  json::Array slotList(ValueRange values) {
    json::Array out;
    for (Value value : values)
      out.push_back(slot(value));
    return out;
  }

  FailureOr<json::Value> tensorSpec(Type type, Operation *anchor) {
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor)
      return anchor->emitOpError("fsdp-to-program: only tensor values lower, got ") << type;
    FailureOr<std::string> dtype = elementTypeName(tensor.getElementType(), anchor);
    if (failed(dtype))
      return failure();
    return json::Value(json::Object{{"shape", shapeOf(tensor)}, {"dtype", *dtype}});
  }

  /// One `args` entry of an fsdp.aten: a tagged literal the runtime converts
  /// to the schema's argument type once, at load.
  FailureOr<json::Value> argument(Attribute arg, AtenOp op) {
    auto operand = [&](Attribute item) -> std::optional<int64_t> {
      auto integer = dyn_cast<IntegerAttr>(item);
      if (integer && integer.getType().isIndex())
        return slot(op.getInputs()[integer.getInt()]);
      return std::nullopt;
    };
    auto real = [](FloatAttr attr) -> json::Value {
      double value = attr.getValueAsDouble();
      if (std::isnan(value))
        return "nan";
      if (std::isinf(value))
        return value > 0 ? "inf" : "-inf";
      return value;
    };
    if (std::optional<int64_t> index = operand(arg))
      return json::Value(json::Object{{"tensor", *index}});
    if (auto integer = dyn_cast<IntegerAttr>(arg)) {
      if (integer.getType().isInteger(1))
        return json::Value(json::Object{{"bool", integer.getValue().getBoolValue()}});
      return json::Value(json::Object{{"int", integer.getInt()}});
    }
    if (auto number = dyn_cast<FloatAttr>(arg))
      return json::Value(json::Object{{"float", real(number)}});
    if (isa<UnitAttr>(arg))
      return json::Value(nullptr);
    if (auto text = dyn_cast<StringAttr>(arg))
      return json::Value(json::Object{{"string", text.getValue()}});
    if (auto type = dyn_cast<TypeAttr>(arg)) {
      FailureOr<std::string> name = elementTypeName(type.getValue(), op);
      if (failed(name))
        return failure();
      return json::Value(json::Object{{"dtype", *name}});
    }
    auto items = dyn_cast<ArrayAttr>(arg);
    if (!items)
      return op.emitOpError("fsdp-to-program: cannot lower argument ") << arg;
    // Lists: tensors (with None holes for Tensor?[]), bools, ints, or floats.
    bool anyOperand = llvm::any_of(items, [&](Attribute item) {
      auto integer = dyn_cast<IntegerAttr>(item);
      return integer && integer.getType().isIndex();
    });
    json::Array values;
    if (anyOperand) {
      for (Attribute item : items) {
        if (std::optional<int64_t> index = operand(item))
          values.push_back(*index);
        else if (isa<UnitAttr>(item))
          values.push_back(nullptr);
        else
          return op.emitOpError("fsdp-to-program: a tensor list mixes tensors with ") << item;
      }
      return json::Value(json::Object{{"tensors", std::move(values)}});
    }
    bool allBool = !items.empty() && llvm::all_of(items, [](Attribute item) {
      auto integer = dyn_cast<IntegerAttr>(item);
      return integer && integer.getType().isInteger(1);
    });
    bool anyFloat = llvm::any_of(items, [](Attribute item) { return isa<FloatAttr>(item); });
    for (Attribute item : items) {
      if (auto integer = dyn_cast<IntegerAttr>(item)) {
        if (allBool)
          values.push_back(integer.getValue().getBoolValue());
        else if (anyFloat)
          values.push_back(static_cast<double>(integer.getInt()));
        else
          values.push_back(integer.getInt());
      } else if (auto number = dyn_cast<FloatAttr>(item)) {
        values.push_back(real(number));
      } else {
        return op.emitOpError("fsdp-to-program: cannot lower list element ") << item;
      }
    }
    StringRef kind = allBool ? "bools" : anyFloat ? "floats" : "ints";
    return json::Value(json::Object{{kind, std::move(values)}});
  }

  FailureOr<std::optional<json::Object>> printAten(AtenOp op) {
    std::optional<AtenOpName> callee = AtenOpName::parse(op.getCallee());
    json::Array args;
    if (ArrayAttr list = op.getArgsAttr()) {
      for (Attribute arg : list) {
        FailureOr<json::Value> value = argument(arg, op);
        if (failed(value))
          return failure();
        args.push_back(std::move(*value));
      }
    } else {
      for (Value input : op.getInputs())
        args.push_back(json::Object{{"tensor", slot(input)}});
    }
    json::Array results;
    for (Value output : op.getOutputs())
      results.push_back(isa<RankedTensorType>(output.getType()) ? json::Value(slot(output))
                                                                : json::Value(nullptr));
    json::Object out{{"op", opText(Kind::Aten)},
                     {"name", (callee->nameSpace + "::" + callee->name).str()},
                     {"overload", callee->overload},
                     {"args", std::move(args)},
                     {"results", std::move(results)}};
    if (std::string loc = locationText(op.getLoc()); !loc.empty())
      out["loc"] = loc;
    return std::optional<json::Object>(std::move(out));
  }

  FailureOr<std::optional<json::Object>> print(Operation &op) {
    using Result = std::optional<json::Object>;
    auto read = [&](Kind kind, StringRef name, Value result) -> Result {
      return json::Object{{"op", opText(kind)}, {"name", name}, {"result", slot(result)}};
    };
    if (auto get = dyn_cast<GetParamOp>(op))
      return read(Kind::Param, get.getName(), get.getResult());
    if (auto get = dyn_cast<GetBufferOp>(op))
      return read(Kind::Buffer, get.getName(), get.getResult());
    if (auto get = dyn_cast<GetAccumulatedGradOp>(op))
      return read(Kind::AccumulatedGrad, get.getName(), get.getResult());
    if (auto aten = dyn_cast<AtenOp>(op))
      return printAten(aten);
    if (auto kernel = dyn_cast<PointwiseOp>(op)) {
      FailureOr<int64_t> index = kernels.index(kernel);
      if (failed(index))
        return failure();
      json::Object out{{"op", opText(Kind::Pointwise)},
                       {"kernel", *index},
                       {"inputs", slotList(kernel.getInputs())},
                       {"results", slotList(kernel.getResults())}};
      if (std::string loc = locationText(op.getLoc()); !loc.empty())
        out["loc"] = loc;
      return Result(std::move(out));
    }
    if (auto cast = dyn_cast<CastOp>(op)) {
      FailureOr<std::string> dtype = elementTypeName(cast.getResult().getType().getElementType(), &op);
      if (failed(dtype))
        return failure();
      return Result(json::Object{{"op", opText(Kind::Cast)}, {"input", slot(cast.getInput())},
                                 {"dtype", *dtype}, {"result", slot(cast.getResult())}});
    }
    if (auto loss = dyn_cast<LossOp>(op))
      return Result(json::Object{{"op", opText(Kind::Loss)}, {"input", slot(loss.getLoss())}});
    if (auto grads = dyn_cast<GradientsOp>(op)) {
      json::Array params;
      for (Attribute param : grads.getParams())
        params.push_back(cast<FlatSymbolRefAttr>(param).getValue());
      return Result(json::Object{{"op", opText(Kind::Gradients)}, {"params", std::move(params)},
                                 {"inputs", slotList(grads.getGrads())}});
    }
    if (isCollectiveStart(&op))
      return printCollective(op);
    if (auto wait = dyn_cast<WaitOp>(op)) {
      json::Object out{{"op", opText(Kind::Wait)}, {"future", future(wait.getFuture())},
                       {"results", slotList(wait.getResults())}};
      if (Operation *start = wait.getFuture().getDefiningOp(); start && start->hasAttr("host") &&
                                                                !isa<AllGatherStartOp>(start))
        out["grads_of"] = gradientParams(wait);
      return Result(std::move(out));
    }
    if (auto reshard = dyn_cast<ReshardOp>(op))
      return Result(json::Object{{"op", opText(Kind::Reshard)}, {"values", slotList(reshard.getBuffers())}});
    if (auto release = dyn_cast<ReleaseOp>(op))
      return Result(json::Object{{"op", opText(Kind::Release)}, {"values", slotList(release.getValues())}});
    if (auto slice = dyn_cast<AllSliceOp>(op))
      return Result(json::Object{
          {"op", opText(Kind::AllSlice)},
          {"group", groups.key(&op, slice.getGridAttr(), slice.getGridAxes())},
          {"input", slot(slice.getInput())},
          {"rows", slice.getResult().getType().getDimSize(0)},
          {"result", slot(slice.getResult())}});
    if (isa<func::ReturnOp>(op)) {
      if (op.getNumOperands() == 0)
        return Result(std::nullopt);
      return Result(json::Object{{"op", opText(Kind::Return)}, {"values", slotList(op.getOperands())}});
    }
    return op.emitOpError("fsdp-to-program: cannot lower this operation");
  }

  /// For a `host` reduction's wait: the parameter whose gradient each
  /// result is (fsdp.gradients names it), or "" for one it does not hand
  /// over. The runtime passes them to a host optimizer stepping in backward.
  static json::Array gradientParams(WaitOp wait) {
    json::Array names;
    for (Value result : wait.getResults()) {
      std::string name;
      for (OpOperand &use : result.getUses())
        if (auto gradients = dyn_cast<GradientsOp>(use.getOwner())) {
          unsigned index = use.getOperandNumber() - gradients.getGrads().getBeginOperandIndex();
          name = cast<FlatSymbolRefAttr>(gradients.getParams()[index]).getValue().str();
          break;
        }
      names.push_back(std::move(name));
    }
    return names;
  }

  FailureOr<std::optional<json::Object>> printCollective(Operation &op) {
    auto gridRef = op.getAttrOfType<FlatSymbolRefAttr>("grid");
    auto axes = op.getAttrOfType<DenseI16ArrayAttr>("grid_axes").asArrayRef();
    json::Array shapes, dtypes;
    for (Type type : futureTypes(&op)) {
      shapes.push_back(shapeOf(type));
      FailureOr<std::string> dtype = elementTypeName(cast<RankedTensorType>(type).getElementType(), &op);
      if (failed(dtype))
        return failure();
      dtypes.push_back(*dtype);
    }
    json::Object out{{"group", groups.key(&op, gridRef, axes)},
                     {"inputs", slotList(op.getOperands())},
                     {"shapes", std::move(shapes)},
                     {"dtypes", std::move(dtypes)},
                     {"future", future(op.getResult(0))}};
    if (auto unit = op.getAttrOfType<FlatSymbolRefAttr>("unit"))
      out["unit"] = unit.getValue();
    out["host"] = op.hasAttr("host");
    if (auto gather = dyn_cast<AllGatherStartOp>(op)) {
      out["op"] = opText(Kind::AllGather);
      out["into_results"] = gather.getIntoResults();
      return std::optional<json::Object>(std::move(out));
    }
    out["op"] = opText(isa<ReduceScatterStartOp>(op) ? Kind::ReduceScatter : Kind::AllReduce);
    FailureOr<std::string> reduceType =
        elementTypeName(op.getAttrOfType<TypeAttr>("reduce_dtype").getValue(), &op);
    if (failed(reduceType))
      return failure();
    out["reduce_dtype"] = *reduceType;
    out["reduction"] = shard::stringifyReductionKind(
        op.getAttrOfType<shard::ReductionKindAttr>("reduction").getValue());
    for (StringRef name : {"pre_divide", "post_divide"})
      out[name] = op.getAttrOfType<FloatAttr>(name) ? op.getAttrOfType<FloatAttr>(name).getValueAsDouble()
                                                   : 1.0;
    return std::optional<json::Object>(std::move(out));
  }

  GroupTable &groups;
  KernelTable &kernels;
  DenseMap<Value, int64_t> slots, futures;
  json::Array inputSpecs;
};

FailureOr<json::Array> parameters(ModuleOp module, GroupTable &groups) {
  json::Array params;
  for (ParamOp param : module.getOps<ParamOp>()) {
    RankedTensorType type = param.getLogicalType();
    FailureOr<std::string> dtype = elementTypeName(type.getElementType(), param);
    if (failed(dtype))
      return failure();
    json::Array tied;
    if (ArrayAttr aliases = param.getAliasesAttr())
      for (Attribute alias : aliases)
        tied.push_back(cast<StringAttr>(alias).getValue());
    json::Object entry{{"name", param.getSymName()},
                       {"shape", shapeOf(type)},
                       {"dtype", *dtype},
                       {"unit", param.getUnit()},
                       {"trainable", param.isTrainable()},
                       {"offloaded", param.isOffloaded()},
                       {"ignored", param.getIgnored()},
                       {"tied", std::move(tied)},
                       {"group", nullptr}};
    if (param.isSharded()) {
      std::string key = groups.key(param, param.getGridAttr(), *param.getGridAxes());
      auto grid = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(param, param.getGridAttr());
      auto layout = fsdp_rt::Dim0ShardLayout::create(type.getDimSize(0),
                                                     groupSize(grid, *param.getGridAxes()));
      entry["group"] = key;
      entry["shard_rows"] = layout->shardRows();
      entry["padding"] = layout->paddingRows();
    }
    params.push_back(std::move(entry));
  }
  return params;
}

} // namespace

LogicalResult mlir::fsdp::translateToProgram(ModuleOp module, raw_ostream &os) {
  GroupTable groups;
  KernelTable kernels;
  FailureOr<json::Array> params = parameters(module, groups);
  if (failed(params))
    return failure();
  json::Array buffers;
  for (BufferOp buffer : module.getOps<BufferOp>()) {
    auto type = cast<RankedTensorType>(buffer.getType());
    FailureOr<std::string> dtype = elementTypeName(type.getElementType(), buffer);
    if (failed(dtype))
      return failure();
    buffers.push_back(json::Object{{"name", buffer.getSymName()}, {"shape", shapeOf(type)},
                                   {"dtype", *dtype}});
  }
  json::Array functions;
  for (func::FuncOp func : module.getOps<func::FuncOp>()) {
    if (func.isExternal())
      continue;
    bool isStep = !func.getOps<LossOp>().empty();
    if (isStep && !func->hasAttr("fsdp.collective_hash"))
      return func.emitError("fsdp-to-program: run fsdp-verify-schedule (or the sharding "
                            "pipeline) first: only a verified schedule lowers");
    FailureOr<json::Object> printed = FunctionPrinter(groups, kernels).print(func);
    if (failed(printed))
      return failure();
    (*printed)["step"] = isStep;
    (*printed)["cuda_graph"] = func->hasAttr(kCudaGraphAttr);
    functions.push_back(std::move(*printed));
  }
  // Compact JSON, laid out for reading: one manifest entry or instruction
  // per line.
  auto lines = [&](StringRef key, json::Array &items, StringRef indent) {
    os << indent << json::Value(key) << ": [";
    for (auto [i, item] : llvm::enumerate(items))
      os << (i ? ",\n" : "\n") << indent << "  " << item;
    os << "\n" << indent << "]";
  };
  std::string device(fsdp_rt::kDefaultDeviceKind);
  if (auto attr = module->getAttrOfType<StringAttr>("fsdp.device"))
    device = attr.getValue().str();
  os << "{\"format\": " << json::Value(std::string(fsdp_rt::kProgramFormat))
     << ", \"version\": " << fsdp_rt::kProgramVersion << ", \"device\": " << json::Value(device) << ",\n";
  json::Array groupList = groups.toJson();
  lines("groups", groupList, " ");
  os << ",\n";
  lines("params", *params, " ");
  os << ",\n";
  lines("buffers", buffers, " ");
  os << ",\n";
  lines("kernels", kernels.toJson(), " ");
  os << ",\n \"functions\": [";
  for (auto [i, value] : llvm::enumerate(functions)) {
    json::Object &function = *value.getAsObject();
    json::Array instructions = std::move(*function.getArray("instructions"));
    function.erase("instructions");
    os << (i ? ",\n" : "\n") << "  {";
    for (const json::Object::value_type *member : json::sortedElements(function))
      os << json::Value(member->first) << ": " << member->second << ", ";
    os << "\n";
    lines("instructions", instructions, "   ");
    os << "}";
  }
  os << "\n ]\n}\n";
  return success();
}
