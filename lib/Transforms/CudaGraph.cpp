//===- CudaGraph.cpp - replay CUDA steps as CUDA graphs -------------------===//
//
// Before: a sharded CUDA step, every instruction issued by the host.
//
//   module attributes {fsdp.device = "cuda"} {
//     func.func @step(%tokens: tensor<8x128xi64>) {
//       ...
//       fsdp.loss %l : tensor<f32>
//       ...
//     }
//   }
//
// After: the runtime captures it once and replays it as one launch.
//
//     func.func @step(%tokens: tensor<8x128xi64>) attributes {fsdp.cuda_graph} {
//
// A step that reads accumulated gradients is left as it is (its inputs are
// new on every call); a CPU step, gloo collectives and offloaded units are
// refused with the reason.
//
// Test: test/Transforms/cuda-graph.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Dialect/FsdpDialect.h"
#include "fsdp/Transforms/Passes.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_CUDAGRAPHPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Marks the steps of `module` that can be replayed; fails with a
/// diagnostic where the module as a whole cannot be.
LogicalResult markReplayedSteps(ModuleOp module, StringRef backend) {
  auto device = module->getAttrOfType<StringAttr>("fsdp.device");
  if (!device || device.getValue() != "cuda")
    return module.emitError() << "cuda-graph needs a step captured for CUDA; this one was captured for "
                              << (device ? device.getValue() : StringRef("cpu"))
                              << " (export with --device cuda)";
  if (backend != "nccl")
    return module.emitError() << "cuda-graph needs NCCL collectives; " << backend
                              << "'s run on the host, where a graph cannot capture them";
  for (UnitOp unit : module.getOps<UnitOp>())
    if (unit.getOffloaded())
      return unit.emitError() << "cuda-graph cannot replay a step that offloads unit @" << unit.getSymName()
                              << ": its host copies and host optimizer run beside the step on host threads";
  for (Step &step : collectSteps(module)) {
    bool readsAccumulated = !step.func.getOps<GetAccumulatedGradOp>().empty();
    if (!readsAccumulated)
      step.func->setAttr(kCudaGraphAttr, UnitAttr::get(module.getContext()));
  }
  return success();
}

struct CudaGraphPass : public fsdp::impl::CudaGraphPassBase<CudaGraphPass> {
  using CudaGraphPassBase::CudaGraphPassBase;

  void runOnOperation() override {
    if (failed(markReplayedSteps(getOperation(), backend)))
      signalPassFailure();
  }
};

} // namespace
