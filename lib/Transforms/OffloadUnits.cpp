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
// Test: test/Transforms/offload-units.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "llvm/ADT/StringSet.h"

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
    if (isChosen(param.getUnitAttr()) && !param.isSharded())
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
      if (!param || !isChosen(param.getUnitAttr()))
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
      signalPassFailure();
  }
};

} // namespace
