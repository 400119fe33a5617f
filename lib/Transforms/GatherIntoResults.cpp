//===- GatherIntoResults.cpp - all-gathers write their results directly ---===//
//
// Before: an all-gather receives every rank's packed bucket into a staging
// buffer, and its wait copies each parameter out of it.
//
//   %f = fsdp.all_gather_start %w, %b on @dp axes = [0] unit @l0
//          : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
//   %w_full, %b_full = fsdp.wait %f : ...
//
// After: the start casts this rank's shard into its place in each
// parameter's padded full tensor, and the collective fills in the rest in
// place (no staging, no copy-out); the results live from the start.
//
//   %f = fsdp.all_gather_start %w, %b on @dp axes = [0] unit @l0 into_results
//          : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
//
// Test: test/Transforms/gather-into-results.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Transforms/Passes.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_GATHERINTORESULTSPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Marks every all-gather but an offloaded unit's (whose shards are copied
/// in on the host-to-device stream, through a receive buffer) to gather into
/// its results.
void gatherIntoResults(ModuleOp module) {
  module.walk([](AllGatherStartOp gather) {
    if (!gather.getHost())
      gather.setIntoResults(true);
  });
}

struct GatherIntoResultsPass : public fsdp::impl::GatherIntoResultsPassBase<GatherIntoResultsPass> {
  using GatherIntoResultsPassBase::GatherIntoResultsPassBase;

  void runOnOperation() override {
    if (backend != "nccl") {
      getOperation().emitError() << "gather-into-results needs backend=nccl, got '" << backend
                                 << "': Gloo gathers through a receive buffer, which the results would sit beside";
      return signalPassFailure();
    }
    gatherIntoResults(getOperation());
  }
};

} // namespace
