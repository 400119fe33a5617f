//===- FuseCasts.cpp - casts into collective copy-in ----------------------===//
//
// Before (mixed precision: bf16 compute, f32 master shards):
//
//   %f = fsdp.all_gather_start %s on ... : tensor<3x4xf32> -> !fsdp.future<tensor<10x4xf32>>
//   %w = fsdp.wait %f : !fsdp.future<tensor<10x4xf32>>
//   %wb = fsdp.cast %w : tensor<10x4xf32> to tensor<10x4xbf16>
//   ...
//   %g = fsdp.cast %gb : tensor<10x4xbf16> to tensor<10x4xf32>
//   %r = fsdp.reduce_scatter_start %g on ... reduce_dtype = f32 ...
//
// After: the all-gather casts while packing and moves bf16; the gradient
// enters the reduce-scatter as bf16 and is widened to the reduce dtype
// (f32 here) while packed.
//
//   %f = fsdp.all_gather_start %s on ... : tensor<3x4xf32> -> !fsdp.future<tensor<10x4xbf16>>
//   %wb = fsdp.wait %f : !fsdp.future<tensor<10x4xbf16>>
//   ...
//   %r = fsdp.reduce_scatter_start %gb on ... reduce_dtype = f32 ...
//
// Test: test/Transforms/fuse-casts.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_FUSECASTSPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// The one dtype every non-free use of `buffer` casts it to, if there is one.
Type commonCastTarget(Value buffer) {
  Type target;
  bool used = false;
  for (Operation *user : buffer.getUsers()) {
    if (isa<ReshardOp>(user))
      continue;
    auto cast = dyn_cast<CastOp>(user);
    if (!cast)
      return nullptr;
    Type to = cast.getResult().getType().getElementType();
    if (target && target != to)
      return nullptr;
    target = to;
    used = true;
  }
  return used ? target : nullptr;
}

/// Gathers in the dtype the parameters are cast to after gathering.
void fuseIntoGather(AllGatherStartOp start) {
  WaitOp wait = waitOf(start);
  if (!wait)
    return;
  Type target;
  for (Value buffer : wait.getResults()) {
    Type to = commonCastTarget(buffer);
    if (!to || !isa<FloatType>(to) || (target && target != to))
      return;
    target = to;
  }
  SmallVector<Type> types;
  for (Type type : futureTypes(start))
    types.push_back(cast<RankedTensorType>(type).clone(target));
  OpBuilder builder(start);
  start.getFuture().setType(FutureType::get(builder.getContext(), types));
  Block &block = *start->getBlock();
  for (auto [buffer, type] : llvm::zip(wait.getResults(), types)) {
    buffer.setType(type);
    for (Operation *user : llvm::make_early_inc_range(buffer.getUsers()))
      if (auto cast = dyn_cast<CastOp>(user)) {
        cast.getResult().replaceAllUsesWith(buffer);
        cast.erase();
      }
    // The buffer now lives as long as the casts' results did: move its free
    // after its (and its views') last reader.
    for (Operation *user : llvm::to_vector(buffer.getUsers())) {
      if (!isa<ReshardOp>(user))
        continue;
      Operation *last =
          lastStorageUser(block, buffer, [](Operation *op) { return !isa<ReshardOp>(op); });
      if (last && user->isBeforeInBlock(last))
        user->moveAfter(last);
    }
  }
}

/// Feeds gradients to a reduction before their cast: its copy-in converts.
template <typename ReductionOp>
void fuseIntoReduction(ReductionOp start, Type reduceDtype) {
  for (OpOperand &input : start->getOpOperands()) {
    auto cast = input.get().template getDefiningOp<CastOp>();
    if (cast && input.get().hasOneUse() && isa<FloatType>(cast.getInput().getType().getElementType())) {
      input.set(cast.getInput());
      cast.erase();
    }
  }
  if (!reduceDtype)
    return;
  start.setReduceDtype(reduceDtype);
  // f16 overflows when summed: divide before and after, as FSDP2 does, the
  // ranks of an average or a gradient divide factor's whole divisor.
  if (!reduceDtype.isF16())
    return;
  double divide = 0;
  if (start.getReduction() == shard::ReductionKind::Average) {
    auto grid = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(start, start.getGridAttr());
    divide = static_cast<double>(groupSize(grid, start.getGridAxes()));
  } else if (!start.getPreDivide() && start.getPostDivide()) {
    divide = start.getPostDivide()->convertToDouble();
  }
  if (divide < 1 || divide != std::floor(divide))
    return;
  int64_t pre = fp16PreDivide(static_cast<int64_t>(divide));
  Builder builder(start.getContext());
  start.setReduction(shard::ReductionKind::Sum);
  if (pre > 1)
    start.setPreDivideAttr(builder.getF64FloatAttr(static_cast<double>(pre)));
  start.setPostDivideAttr(builder.getF64FloatAttr(divide / static_cast<double>(pre)));
}

/// The reduce dtype: the option, else the module's mixed precision policy
/// (reduce_dtype, else param_dtype), else none (keep each reduction's).
FailureOr<Type> reduceDtypeFor(ModuleOp module, StringRef option) {
  MLIRContext *context = module.getContext();
  if (!option.empty()) {
    Type type = parseFloatType(context, option);
    if (!type)
      return module.emitError() << "reduce-dtype must be f32, bf16 or f16, got '" << option << "'";
    return type;
  }
  auto policy = module->getAttrOfType<DictionaryAttr>("fsdp.mixed_precision");
  if (!policy)
    return Type();
  for (StringRef key : {"reduce_dtype", "param_dtype"})
    if (auto type = policy.getAs<TypeAttr>(key))
      return type.getValue();
  return Type();
}

struct FuseCastsPass : public fsdp::impl::FuseCastsPassBase<FuseCastsPass> {
  using FuseCastsPassBase::FuseCastsPassBase;

  void runOnOperation() override {
    FailureOr<Type> reduceType = reduceDtypeFor(getOperation(), reduceDtype);
    if (failed(reduceType))
      return signalPassFailure();
    for (Step &step : collectSteps(getOperation())) {
      for (auto start : llvm::to_vector(step.body().getOps<AllGatherStartOp>()))
        fuseIntoGather(start);
      for (auto start : step.body().getOps<ReduceScatterStartOp>())
        fuseIntoReduction(start, *reduceType);
      for (auto start : step.body().getOps<AllReduceStartOp>())
        if (isGradientReduction(start)) // a sum of activations keeps its own dtype
          fuseIntoReduction(start, *reduceType);
    }
  }
};

} // namespace
