//===- Memory.h - the per-rank memory model of a step ------------*- C++ -*-===//
//
// The model the memory report prints and the passes that plan by memory
// (fsdp-offload-units) consult: the state that exists when the step starts
// plus a walk of the schedule in program order that follows the runtime's
// rules exactly (lib/Transforms/MemoryReport.cpp describes them).
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_ANALYSIS_MEMORY_H
#define FSDP_ANALYSIS_MEMORY_H

#include "fsdp/Analysis/Step.h"

namespace mlir::fsdp {

struct Persistent {
  int64_t params = 0, grads = 0, optimizer = 0, buffers = 0, batch = 0, accumulation = 0;
  /// Offloaded units' shards, gradients and optimizer state, in host memory.
  int64_t hostParams = 0, hostGrads = 0, hostOptimizer = 0;
  bool hostIsDevice = false;
  int64_t host() const { return hostParams + hostGrads + hostOptimizer; }
  int64_t total() const {
    return params + grads + optimizer + buffers + batch + accumulation + (hostIsDevice ? host() : 0);
  }
  /// What the step makes itself: the gradients of the device (the walk
  /// counts them from their reduction's wait).
  int64_t madeByStep() const { return grads + (hostIsDevice ? hostGrads : 0); }
};

struct Walk {
  int64_t peak = 0, peakGathered = 0, peakActivations = 0, peakStaging = 0, peakGradients = 0;
  int64_t mostGathered = 0; // gathered parameters alive at once, at any point
  Operation *peakOp = nullptr;
  int64_t savedActivations = 0;
  SmallVector<int64_t> timeline; // bytes allocated by the step, live after each op
  SmallVector<std::pair<int64_t, Value>> largestAtPeak;
};

/// Whether `op`'s tensor results are storage the step allocates as it runs
/// (what it computes; a collective's results are its wait's, views share
/// their source's).
bool computesStorage(Operation *op);
/// Whether `user` hands its operand over beyond the step (the loss, the
/// gradients, a returned value): that storage lives to the step's end.
bool handsOverPastStep(Operation *user);

/// Whether the module runs where host memory is the device's (a CPU target).
bool hostIsDevice(ModuleOp module);

/// Optimizer state tensors per parameter element; an error on `anchor`
/// for an unknown optimizer.
FailureOr<int64_t> optimizerStatesPerElement(StringRef optimizer, Operation *anchor);

/// Bytes of the copy of `param` one rank stores: its padded shard, or the
/// whole parameter when replicated.
int64_t localBytes(ParamOp param, SymbolTableCollection &tables);

/// What one parameter keeps on a rank: its shard, and for a trainable one
/// its gradient shard and optimizer state.
struct ParamState {
  int64_t shard, grad, optimizer;
  int64_t total() const { return shard + grad + optimizer; }
};
ParamState paramState(ParamOp param, SymbolTableCollection &tables, int64_t statesPerElement);

Persistent persistentState(ModuleOp module, Step &step, int64_t statesPerElement);

/// Where the walk frees a storage: at the fsdp.release and fsdp.reshard of
/// its last alias (the runtime's rule), or, for passes that run before
/// fsdp-plan-lifetimes, where that pass will release it: after its last use.
enum class Frees { AtReleases, AfterLastUse };

/// Walks `step`'s schedule; `gloo`: the runtime's Gloo staging rules.
Walk walkSchedule(Step &step, bool gloo, bool hostIsDevice, Frees frees = Frees::AtReleases);

/// The device peak of `step`: its state at the start plus the walk's peak.
int64_t devicePeak(ModuleOp module, Step &step, int64_t statesPerElement, bool gloo);

} // namespace mlir::fsdp

#endif // FSDP_ANALYSIS_MEMORY_H
