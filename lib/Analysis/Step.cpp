//===- Step.cpp - facts about a training step the passes share ------------===//

#include "fsdp/Analysis/Step.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::fsdp;

bool Step::isBackward(Operation *op) {
  Operation *here = inBlock(body(), op);
  return here && loss && loss->isBeforeInBlock(here);
}

SmallVector<Step> mlir::fsdp::collectSteps(ModuleOp module) {
  SmallVector<Step> steps;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func.isExternal())
      continue;
    Step step{func, nullptr, nullptr};
    for (Operation &op : func.getBody().front()) {
      if (auto loss = dyn_cast<LossOp>(op))
        step.loss = loss;
      else if (auto gradients = dyn_cast<GradientsOp>(op))
        step.gradients = gradients;
    }
    if (step.loss)
      steps.push_back(step);
  }
  return steps;
}

int64_t mlir::fsdp::elementBytes(Type elementType) {
  if (auto complex = dyn_cast<ComplexType>(elementType))
    return 2 * elementBytes(complex.getElementType());
  return std::max<int64_t>(1, (elementType.getIntOrFloatBitWidth() + 7) / 8);
}

int64_t mlir::fsdp::tensorBytes(Type tensorType) {
  auto tensor = dyn_cast<RankedTensorType>(tensorType);
  if (!tensor || !tensor.hasStaticShape())
    return 0;
  return tensor.getNumElements() * elementBytes(tensor.getElementType());
}

int64_t mlir::fsdp::groupSize(shard::GridOp grid, ArrayRef<int16_t> axes) {
  int64_t size = 1;
  for (int16_t axis : axes)
    size *= grid.getShape()[axis];
  return size;
}

ArrayRef<Type> mlir::fsdp::futureTypes(Operation *start) {
  return cast<FutureType>(start->getResult(0).getType()).getResults();
}

WaitOp mlir::fsdp::waitOf(Operation *start) {
  Value future = start->getResult(0);
  return future.hasOneUse() ? dyn_cast<WaitOp>(*future.getUsers().begin()) : WaitOp();
}

bool mlir::fsdp::isCollectiveStart(Operation *op) {
  return isa_and_nonnull<AllGatherStartOp, ReduceScatterStartOp, AllReduceStartOp>(op);
}

bool mlir::fsdp::isGradientReduction(Operation *op) {
  return isa<ReduceScatterStartOp, AllReduceStartOp>(op) && op->getAttr("unit");
}

int64_t mlir::fsdp::collectivePayloadBytes(Operation *start, int64_t ranks) {
  int64_t bytes = 0;
  if (isa<AllGatherStartOp>(start)) {
    Type wire = cast<RankedTensorType>(futureTypes(start).front()).getElementType();
    for (Value input : start->getOperands())
      bytes += ranks * cast<RankedTensorType>(input.getType()).getNumElements() * elementBytes(wire);
    return bytes;
  }
  Type wire = start->getAttrOfType<TypeAttr>("reduce_dtype").getValue();
  for (auto [input, result] : llvm::zip(start->getOperands(), futureTypes(start))) {
    int64_t elements = cast<RankedTensorType>(input.getType()).getNumElements();
    if (isa<ReduceScatterStartOp>(start)) // padded to ranks x shard rows
      elements = ranks * cast<RankedTensorType>(result).getNumElements();
    bytes += elements * elementBytes(wire);
  }
  return bytes;
}

Operation *mlir::fsdp::inBlock(Block &block, Operation *op) {
  return block.findAncestorOpInBlock(*op);
}

/// The kept user of `values` furthest toward the block's end (`last`) or start.
static Operation *boundaryUser(Block &block, ArrayRef<Value> values,
                               function_ref<bool(Operation *)> keep, bool last) {
  Operation *found = nullptr;
  for (Value value : values)
    for (Operation *user : value.getUsers()) {
      Operation *here = inBlock(block, user);
      if (!here || !keep(here))
        continue;
      if (!found || (last ? found->isBeforeInBlock(here) : here->isBeforeInBlock(found)))
        found = here;
    }
  return found;
}

Operation *mlir::fsdp::lastUser(Block &block, ArrayRef<Value> values,
                                function_ref<bool(Operation *)> keep) {
  return boundaryUser(block, values, keep, /*last=*/true);
}

Operation *mlir::fsdp::firstUser(Block &block, ArrayRef<Value> values,
                                 function_ref<bool(Operation *)> keep) {
  return boundaryUser(block, values, keep, /*last=*/false);
}

Operation *mlir::fsdp::lastStorageUser(Block &block, Value buffer,
                                       function_ref<bool(Operation *)> keep) {
  return lastUser(block, viewClosure(buffer), keep);
}

Operation *mlir::fsdp::firstStorageUser(Block &block, Value buffer,
                                        function_ref<bool(Operation *)> keep) {
  return firstUser(block, viewClosure(buffer), keep);
}

int64_t mlir::fsdp::fp16PreDivide(int64_t ranks) {
  int64_t pre = 1;
  while (ranks % (pre * 2) == 0 && ranks / (pre * 2) >= pre * 2)
    pre *= 2;
  return pre;
}

FailureOr<SmallVector<ParamOp>> mlir::fsdp::paramsNamed(ModuleOp module, ArrayRef<std::string> names,
                                                       StringRef option) {
  llvm::StringMap<ParamOp> byName;
  for (ParamOp param : module.getOps<ParamOp>()) {
    byName[param.getSymName()] = param;
    if (ArrayAttr aliases = param.getAliasesAttr())
      for (Attribute alias : aliases)
        byName[cast<StringAttr>(alias).getValue()] = param;
  }
  SmallVector<ParamOp> named;
  for (const std::string &name : names) {
    ParamOp param = byName.lookup(name);
    if (!param)
      return module.emitError() << option << " names '" << name << "', which is no parameter of the step";
    named.push_back(param);
  }
  return named;
}

Type mlir::fsdp::parseFloatType(MLIRContext *context, StringRef name) {
  if (name == "f32")
    return Float32Type::get(context);
  if (name == "bf16")
    return BFloat16Type::get(context);
  if (name == "f16")
    return Float16Type::get(context);
  return nullptr;
}

LogicalResult mlir::fsdp::checkBackend(Operation *module, StringRef backend) {
  if (backend != "gloo" && backend != "nccl")
    return module->emitError() << "unknown collective backend '" << backend << "'; use gloo or nccl";
  return success();
}

LogicalResult mlir::fsdp::checkReportFormat(Operation *module, StringRef format) {
  if (format != "table" && format != "json")
    return module->emitError() << "report format must be table or json, got '" << format << "'";
  return success();
}

LogicalResult mlir::fsdp::writeReport(Operation *module, StringRef path, StringRef format,
                                      llvm::json::Value report, StringRef table) {
  std::string text =
      format == "json" ? llvm::formatv("{0:2}\n", report).str() : table.str();
  if (path == "-") {
    llvm::outs() << text;
    llvm::outs().flush();
    return success();
  }
  std::error_code error;
  llvm::ToolOutputFile file(path, error, llvm::sys::fs::OF_Text);
  if (error)
    return module->emitError() << "cannot write report '" << path << "': " << error.message();
  file.os() << text;
  file.keep();
  return success();
}
