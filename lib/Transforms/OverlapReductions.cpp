//===- OverlapReductions.cpp - reductions overlap the next unit's backward -===//
//
// Before: each gradient reduction is waited for right after it starts, so
// backward stops while it runs.
//
//   %r1 = fsdp.reduce_scatter_start %g1 on ... unit @l1
//   %s1 = fsdp.wait %r1 ...
//   ... backward of l0 ...
//   %r0 = fsdp.reduce_scatter_start %g0 on ... unit @l0
//   %s0 = fsdp.wait %r0 ...
//   fsdp.gradients %s0, %s1
//
// After (depth=1): a reduction is waited for when the next one starts (or
// where its result is first read, if earlier), so it runs under the next
// unit's backward, as FSDP2 waits for the previous reduce-scatter before
// issuing the next.
//
//   %r1 = fsdp.reduce_scatter_start %g1 on ... unit @l1
//   ... backward of l0 ...
//   %s1 = fsdp.wait %r1 ...
//   %r0 = fsdp.reduce_scatter_start %g0 on ... unit @l0
//   %s0 = fsdp.wait %r0 ...
//   fsdp.gradients %s0, %s1
//
// Test: test/Transforms/overlap-reductions.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_OVERLAPREDUCTIONSPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Moves each reduction's wait down to the start of the reduction `depth`
/// places later, or to the first reader of its results if that comes
/// first; the last `depth` reductions are waited for where their results
/// are first read. Starts stay where they are, so the collective sequence,
/// and with it every rank's order, is unchanged.
void overlapReductions(Step &step, int64_t depth) {
  SmallVector<Operation *> reductions;
  for (Operation &op : step.body())
    if (isGradientReduction(&op))
      reductions.push_back(&op);
  for (auto [index, start] : llvm::enumerate(reductions)) {
    WaitOp wait = waitOf(start);
    if (!wait)
      continue;
    SmallVector<Value> results(wait->getResults());
    Operation *target = firstUser(step.body(), results, [](Operation *) { return true; });
    if (index + depth < reductions.size()) {
      Operation *next = reductions[index + depth];
      if (!target || next->isBeforeInBlock(target))
        target = next;
    }
    if (target && wait->isBeforeInBlock(target) && wait->getNextNode() != target)
      wait->moveBefore(target);
  }
}

struct OverlapReductionsPass : public fsdp::impl::OverlapReductionsPassBase<OverlapReductionsPass> {
  using OverlapReductionsPassBase::OverlapReductionsPassBase;

  void runOnOperation() override {
    if (depth < 0) {
      getOperation().emitError("overlap-reductions depth must be >= 0, got ") << static_cast<int64_t>(depth);
      return signalPassFailure();
    }
    if (depth == 0)
      return;
    for (Step &step : collectSteps(getOperation()))
      overlapReductions(step, depth);
  }
};

} // namespace
