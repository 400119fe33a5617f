//===- Step.h - facts about a training step the passes share ----*- C++ -*-===//

#ifndef FSDP_ANALYSIS_STEP_H
#define FSDP_ANALYSIS_STEP_H

#include "fsdp/Dialect/FsdpOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/JSON.h"

namespace mlir::fsdp {

/// The name of the grid that shard-parameters declares.
inline constexpr llvm::StringLiteral kGridName = "fsdp_grid";

/// A training-step function: its body block, its loss marker (the
/// forward/backward boundary) and its gradients op, if any.
struct Step {
  func::FuncOp func;
  LossOp loss;
  GradientsOp gradients;

  Block &body() { return func.getBody().front(); }
  /// Whether `op` (anywhere in the body) runs after the loss: backward.
  bool isBackward(Operation *op);
};

/// The module's step functions: functions with an fsdp.loss.
SmallVector<Step> collectSteps(ModuleOp module);

/// Bytes of one element (i1 counts as a byte, as torch stores bools).
int64_t elementBytes(Type elementType);
int64_t tensorBytes(Type tensorType);

/// The group size of `axes` of `grid`; the grid's shape must be static there.
int64_t groupSize(shard::GridOp grid, ArrayRef<int16_t> axes);

/// A collective start's future result types.
ArrayRef<Type> futureTypes(Operation *start);
/// The wait of a collective start (its future's one user).
WaitOp waitOf(Operation *start);
/// Whether `op` is an fsdp.*_start.
bool isCollectiveStart(Operation *op);
/// Whether `op` starts a gradient reduction: a reduce-scatter or all-reduce
/// naming the unit whose gradients it reduces. A unit-less all-reduce sums
/// activations across the ranks (an `fsdp.data_parallel_sum` lowered): its
/// dtype and its place in the schedule are the model's, not the policy's.
bool isGradientReduction(Operation *op);
/// The full padded tensors of a collective start over `ranks` ranks, in
/// bytes of the dtype it communicates (the gathered tensors, or the tensors
/// reduced).
int64_t collectivePayloadBytes(Operation *start, int64_t ranks);

/// `op`'s ancestor in `block` (op itself if it is there).
Operation *inBlock(Block &block, Operation *op);
/// The last / first user of any of `values` in `block` order, by ancestor,
/// among the users that satisfy `keep`; null if none.
Operation *lastUser(Block &block, ArrayRef<Value> values, function_ref<bool(Operation *)> keep);
Operation *firstUser(Block &block, ArrayRef<Value> values, function_ref<bool(Operation *)> keep);
/// The same over `buffer` and its views, which share its storage.
Operation *lastStorageUser(Block &block, Value buffer, function_ref<bool(Operation *)> keep);
Operation *firstStorageUser(Block &block, Value buffer, function_ref<bool(Operation *)> keep);

/// FSDP2's pre-divide for an fp16 sum over `ranks`: the largest power of two
/// p with p * p <= ranks dividing ranks; the post-divide is ranks / p.
int64_t fp16PreDivide(int64_t ranks);

/// The parameters `names` name, by FQN or tied name (FSDP2's
/// `ignored_params`, as the pipeline's `ignored-params` lists them); a name
/// that names none is reported on `module`, with `option` the option that
/// gave it.
FailureOr<SmallVector<ParamOp>> paramsNamed(ModuleOp module, ArrayRef<std::string> names, StringRef option);

/// Element type `name` ("f32", "bf16", "f16"), or null.
Type parseFloatType(MLIRContext *context, StringRef name);

/// Checks a collective backend option: "gloo" or "nccl".
LogicalResult checkBackend(Operation *module, StringRef backend);
/// Checks a report format option: "table" or "json".
LogicalResult checkReportFormat(Operation *module, StringRef format);
/// Writes a report to `path` ("-" is stdout): `report` as JSON or `table`
/// as text, by `format`; on failure reports on `module`.
LogicalResult writeReport(Operation *module, StringRef path, StringRef format,
                          llvm::json::Value report, StringRef table);

} // namespace mlir::fsdp

#endif // FSDP_ANALYSIS_STEP_H
