//===- OffloadUnits.cpp - keep units' state in host memory ----------------===//
//
// Before: a scheduled step.
//
//   fsdp.unit @l0
//   %w = fsdp.get_param @"l0.w" : tensor<4x8xf32>
//   %f = fsdp.all_gather_start %w on @dp axes = [0] unit @l0 : ...
//   ...
//   %r = fsdp.reduce_scatter_start %gw on @dp axes = [0] ... unit @l0 : ...
//   %g = fsdp.wait %r : ...
//   fsdp.gradients [@"l0.w"] %g : tensor<4x8xf32>
//
// After (units=l0): the unit is offloaded and its collectives say where the
// shards come from and the gradients go; nothing moves.
//
//   fsdp.unit @l0 offloaded
//   %f = fsdp.all_gather_start %w on @dp axes = [0] unit @l0 host : ...
//   %r = fsdp.reduce_scatter_start %gw on @dp axes = [0] ... unit @l0 host : ...
//
// With fit-bytes=N the units are chosen by the memory model instead: the
// fewest bytes whose offload brings the device peak within N bytes.
//
// Test: test/Transforms/offload-units.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Memory.h"
#include "fsdp/Transforms/Passes.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_OFFLOADUNITSPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Marks `chosen` units and their collectives; fails with a diagnostic for
/// a unit that cannot be offloaded.
LogicalResult offloadUnits(ModuleOp module, const llvm::StringSet<> &chosen) {
  auto isChosen = [&](FlatSymbolRefAttr unit) { return unit && chosen.contains(unit.getValue()); };
  llvm::StringMap<ParamOp> params;
  for (ParamOp param : module.getOps<ParamOp>()) {
    params[param.getSymName()] = param;
    if (isChosen(param.getUnitAttr()) && !param.isSharded() && !param.getIgnored())
      return param.emitError() << "cannot offload unit " << param.getUnitAttr() << ": parameter '"
                               << param.getSymName()
                               << "' is replicated (no-shard); only shards are offloaded";
  }
  for (UnitOp unit : module.getOps<UnitOp>())
    if (chosen.contains(unit.getSymName()))
      unit.setOffloaded(true);
  for (Step &step : collectSteps(module)) {
    WalkResult walk = step.func.walk([&](AllGatherStartOp gather) {
      if (!isChosen(gather.getUnitAttr()))
        return WalkResult::advance();
      unsigned shards = llvm::count_if(gather.getInputs(),
                                       [](Value input) { return input.getDefiningOp<GetParamOp>(); });
      if (shards == gather.getInputs().size())
        gather.setHost(true);
      else if (shards != 0)
        return gather.emitError() << "cannot offload unit " << gather.getUnitAttr()
                                  << ": this all-gather mixes parameter shards with other tensors",
               WalkResult::interrupt();
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return failure();
    if (!step.gradients || step.gradients.getUnreduced())
      continue;
    for (auto [name, grad] : llvm::zip(step.gradients.getParams(), step.gradients.getGrads())) {
      ParamOp param = params.lookup(cast<FlatSymbolRefAttr>(name).getValue());
      if (!param || !param.isOffloaded())
        continue;
      auto wait = grad.getDefiningOp<WaitOp>();
      Operation *start = wait ? wait.getFuture().getDefiningOp() : nullptr;
      if (auto reduction = dyn_cast_or_null<ReduceScatterStartOp>(start))
        reduction.setHost(true);
      else if (auto reduction = dyn_cast_or_null<AllReduceStartOp>(start))
        reduction.setHost(true);
      else
        return step.gradients.emitError() << "cannot offload unit " << param.getUnitAttr()
                                          << ": the gradient of '" << param.getSymName()
                                          << "' is not the result of a reduction";
    }
  }
  return success();
}

std::string mib(int64_t bytes) {
  std::string text;
  llvm::raw_string_ostream(text) << llvm::format("%.1f MiB", bytes / 1048576.0);
  return text;
}

/// Undoes offloadUnits, so that another choice can be tried.
void clearOffload(ModuleOp module) {
  for (UnitOp unit : module.getOps<UnitOp>())
    unit.setOffloaded(false);
  module.walk([](Operation *op) {
    if (isCollectiveStart(op))
      op->removeAttr("host");
  });
}

/// Adds units to `chosen` until every step's device peak is within
/// `budget` bytes: each round the smallest unit whose state covers the
/// excess, else the largest, then the model is walked again (offloading
/// also changes what the collectives stage). Of units the same size, the
/// one the forward gathers last: its gradients land first in backward, so
/// the host optimizer starts early, and the next forward begins with units
/// the host does not update (and the device peak, late in the forward and
/// early in backward, loses the state of the units resident there).
LogicalResult offloadToFit(ModuleOp module, int64_t budget, int64_t states, bool gloo,
                           llvm::StringSet<> &chosen) {
  if (hostIsDevice(module))
    return module.emitError() << "offload to fit a device memory budget needs a GPU target: on a CPU "
                                 "target host memory is the device's (fsdp.device is cpu)";
  SymbolTableCollection tables;
  llvm::StringMap<int64_t> saving; // bytes a unit's offload takes off the device
  llvm::StringSet<> offloadable;
  for (UnitOp unit : module.getOps<UnitOp>())
    offloadable.insert(unit.getSymName());
  for (ParamOp param : module.getOps<ParamOp>()) {
    StringRef unit = param.getUnitAttr().getValue();
    if (param.getIgnored())
      continue; // stays on the device whatever its unit does
    if (!param.isSharded())
      offloadable.erase(unit);
    saving[unit] += paramState(param, tables, states).total();
  }
  SmallVector<Step> steps = collectSteps(module);
  llvm::StringMap<int> gathered; // unit -> the position of its first gather in the first step
  if (!steps.empty())
    steps.front().func.walk([&](AllGatherStartOp gather) {
      if (gather.getUnitAttr())
        gathered.try_emplace(gather.getUnitAttr().getValue(), int(gathered.size()));
    });
  auto peak = [&] {
    int64_t most = 0;
    for (Step &step : steps)
      most = std::max(most, devicePeak(module, step, states, gloo));
    return most;
  };
  for (int64_t now = peak(); now > budget; now = peak()) {
    int64_t excess = now - budget;
    StringRef pick;
    for (UnitOp unit : module.getOps<UnitOp>()) {
      StringRef name = unit.getSymName();
      if (chosen.contains(name) || !offloadable.contains(name) || saving.lookup(name) == 0)
        continue;
      int64_t bytes = saving.lookup(name), best = pick.empty() ? 0 : saving.lookup(pick);
      bool covers = bytes >= excess, bestCovers = !pick.empty() && best >= excess;
      bool later = !pick.empty() && bytes == best && gathered.lookup(name) > gathered.lookup(pick);
      if (pick.empty() || (covers && (!bestCovers || bytes < best)) || (!covers && !bestCovers && bytes > best) ||
          (covers == bestCovers && later))
        pick = name;
    }
    if (pick.empty())
      return module.emitError() << "the step does not fit " << budget << " bytes (" << mib(budget)
                                << ") of device memory even with every unit it can offload in host memory: "
                                << "its peak is " << now << " bytes, " << excess << " (" << mib(excess)
                                << ") over";
    chosen.insert(pick);
    clearOffload(module);
    if (failed(offloadUnits(module, chosen)))
      return failure();
  }
  return success();
}

struct OffloadUnitsPass : public fsdp::impl::OffloadUnitsPassBase<OffloadUnitsPass> {
  using OffloadUnitsPassBase::OffloadUnitsPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::StringSet<> known, chosen;
    for (UnitOp unit : module.getOps<UnitOp>())
      known.insert(unit.getSymName());
    for (const std::string &name : units) {
      if (name == "*") {
        chosen = known;
        continue;
      }
      if (!known.contains(name)) {
        std::string list;
        for (UnitOp unit : module.getOps<UnitOp>())
          list += (list.empty() ? "" : ", ") + unit.getSymName().str();
        module.emitError() << "offload names unit '" << name << "', which the module does not have; its units: "
                           << list;
        return signalPassFailure();
      }
      chosen.insert(name);
    }
    if (!chosen.empty() && failed(offloadUnits(module, chosen)))
      return signalPassFailure();
    if (fitBytes <= 0)
      return;
    FailureOr<int64_t> states = optimizerStatesPerElement(optimizer, module);
    if (failed(states) || failed(offloadToFit(module, fitBytes, *states, backend == "gloo", chosen)))
      signalPassFailure();
  }
};

} // namespace
