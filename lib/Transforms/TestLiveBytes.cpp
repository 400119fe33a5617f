//===- TestLiveBytes.cpp - the memory model's walk, written out for tests -===//
//
// Before (a step whose releases are stripped, `frees=last-use`):
//
//   func.func @train_step(...) { %h = fsdp.aten "aten::mm" ... fsdp.loss %l ... }
//
// After:
//
//   func.func @train_step(...) attributes {test.live_after = array<i64: 32, 64, ...>,
//                                          test.live_peak = 96 : i64} { ... }
//
// Test: test/Transforms/test-live-bytes.mlir; python/tests/test_pointwise_kernels.py
// holds the last-use rule against the releases plan-lifetimes places.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Memory.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_TESTLIVEBYTESPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

struct TestLiveBytesPass : public fsdp::impl::TestLiveBytesPassBase<TestLiveBytesPass> {
  using TestLiveBytesPassBase::TestLiveBytesPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (frees != "releases" && frees != "last-use") {
      module.emitError() << "fsdp-test-live-bytes: frees must be releases or last-use, got '" << frees << "'";
      return signalPassFailure();
    }
    if (failed(checkBackend(module, backend)))
      return signalPassFailure();
    Builder builder(module.getContext());
    for (Step &step : collectSteps(module)) {
      Walk walk = walkSchedule(step, backend == "gloo", hostIsDevice(module),
                               frees == "releases" ? Frees::AtReleases : Frees::AfterLastUse);
      SmallVector<int64_t> after;
      for (auto [op, live] : llvm::zip(step.body(), walk.timeline))
        if (!isa<ReleaseOp>(op))
          after.push_back(live);
      step.func->setAttr("test.live_after", builder.getDenseI64ArrayAttr(after));
      step.func->setAttr("test.live_peak", builder.getI64IntegerAttr(walk.peak));
    }
  }
};

} // namespace
