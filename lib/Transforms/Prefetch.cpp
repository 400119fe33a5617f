//===- Prefetch.cpp - start all-gathers a unit early ----------------------===//
//
// Before (forward-depth=1): each unit's gather starts right before its wait.
//
//   %f0 = fsdp.all_gather_start %a on ... unit @u0
//   %a0 = fsdp.wait %f0 ...
//   ... compute of u0 ...
//   %f1 = fsdp.all_gather_start %b on ... unit @u1
//   %b1 = fsdp.wait %f1 ...
//   ... compute of u1 ...
//
// After: u1's gather starts as soon as u0's has arrived, and overlaps u0's
// compute. In backward, a gather in flight is waited for before a reduction
// starts, so that the two never hold staging buffers at once.
//
//   %f0 = fsdp.all_gather_start %a on ... unit @u0
//   %a0 = fsdp.wait %f0 ...
//   %f1 = fsdp.all_gather_start %b on ... unit @u1 prefetch 1
//   ... compute of u0 ...
//   %b1 = fsdp.wait %f1 ...
//   ... compute of u1 ...
//
// Test: test/Transforms/prefetch.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_PREFETCHPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

class Prefetcher {
public:
  Prefetcher(Step &step, int64_t budgetBytes) : step(step), budgetBytes(budgetBytes) {}

  void run(bool backward, int64_t depth) {
    SmallVector<AllGatherStartOp> gathers;
    for (auto start : step.body().getOps<AllGatherStartOp>())
      if (step.isBackward(start) == backward && waitOf(start))
        gathers.push_back(start);
    Operation *phaseStart = backward ? step.loss->getNextNode() : &step.body().front();
    for (size_t j = 0; j < gathers.size(); ++j) {
      for (int64_t k = depth; k >= 1; --k) {
        // Right after the wait of the unit k earlier, never before the
        // previous start, so starts keep their order.
        // Backward starts where the loss's gradient is at its largest, so
        // its first units are not started early (FSDP2 gathers them on
        // demand too); forward has nothing alive yet at its start.
        if (j < static_cast<size_t>(k) && backward)
          continue;
        Operation *target = j >= static_cast<size_t>(k)
                                ? waitOf(gathers[j - k])->getNextNode()
                                : phaseStart;
        if (j > 0 && target->isBeforeInBlock(gathers[j - 1]->getNextNode()))
          target = gathers[j - 1]->getNextNode();
        if (tryMove(gathers[j], target)) {
          // How many units ahead it now starts: fewer than k near the phase start.
          int64_t ahead = std::min<int64_t>(k, j);
          if (ahead > 0)
            gathers[j].setPrefetch(ahead);
          break;
        }
      }
    }
  }

  /// In backward, a gather still in flight when a reduction starts is waited
  /// for first: its receive buffers (with the collective library's
  /// temporaries) turn into the smaller gathered parameters before the
  /// reduction's staging buffers are allocated, at the point where
  /// backward's memory peaks. The gather has overlapped all the compute
  /// before; only its overlap with the reduction's start is given up.
  void waitBeforeReductions() {
    SmallVector<Operation *> reductions;
    for (Operation &op : step.body())
      if (isGradientReduction(&op) && step.isBackward(&op))
        reductions.push_back(&op);
    for (Operation *reduction : reductions)
      for (auto gather : step.body().getOps<AllGatherStartOp>()) {
        if (!gather->isBeforeInBlock(reduction))
          continue;
        WaitOp wait = waitOf(gather);
        if (wait && reduction->isBeforeInBlock(wait))
          wait->moveBefore(reduction);
      }
  }

private:
  /// Moves `start` (and the parameter reads it needs) before `target` if that
  /// is earlier, its inputs allow it and the budget holds.
  bool tryMove(AllGatherStartOp start, Operation *target) {
    if (!target->isBeforeInBlock(start))
      return false;
    SmallVector<Operation *> reads;
    for (Value input : start.getInputs()) {
      Operation *def = input.getDefiningOp();
      if (!def || def->isBeforeInBlock(target))
        continue;
      if (!isa<GetParamOp>(def))
        return false;
      reads.push_back(def);
    }
    Operation *before = start->getNextNode();
    SmallVector<Operation *> readsBefore;
    for (Operation *read : reads)
      readsBefore.push_back(read->getNextNode());
    for (Operation *read : reads)
      if (read != target)
        read->moveBefore(target);
    if (llvm::is_contained(reads, target))
      start->moveAfter(target);
    else
      start->moveBefore(target);
    if (budgetBytes <= 0 || peakGatheredBytes() <= budgetBytes)
      return true;
    // Undo, last moved first, so every recorded neighbour is back in place.
    start->moveBefore(before);
    for (auto [read, next] : llvm::reverse(llvm::zip(reads, readsBefore)))
      read->moveBefore(next);
    return false;
  }

  /// Bytes of gathered parameters alive at the worst point: allocated at
  /// the all-gather's start, released by reshard.
  int64_t peakGatheredBytes() {
    int64_t live = 0, peak = 0;
    for (Operation &op : step.body()) {
      if (isa<AllGatherStartOp>(op))
        for (Type type : futureTypes(&op))
          live += tensorBytes(type);
      if (auto reshard = dyn_cast<ReshardOp>(op))
        for (Value buffer : reshard.getBuffers())
          live -= tensorBytes(buffer.getType());
      peak = std::max(peak, live);
    }
    return peak;
  }

  Step &step;
  int64_t budgetBytes;
};

struct PrefetchPass : public fsdp::impl::PrefetchPassBase<PrefetchPass> {
  using PrefetchPassBase::PrefetchPassBase;

  void runOnOperation() override {
    if (forwardDepth < 0 || backwardDepth < 0 || memoryBudgetMb < 0) {
      getOperation().emitError("prefetch depths and memory budget must be >= 0");
      return signalPassFailure();
    }
    for (Step &step : collectSteps(getOperation())) {
      Prefetcher prefetcher(step, memoryBudgetMb * 1024 * 1024);
      prefetcher.run(/*backward=*/false, forwardDepth);
      prefetcher.run(/*backward=*/true, backwardDepth);
      prefetcher.waitBeforeReductions();
    }
  }
};

} // namespace
