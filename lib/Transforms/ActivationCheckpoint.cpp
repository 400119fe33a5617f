//===- ActivationCheckpoint.cpp - recompute forward values in backward -----===//
//
// Before (units=blocks.0):
//
//   %h = fsdp.aten "aten::mm" (%x, %w) module "blocks.0"      // forward
//   %a = fsdp.aten "aten::relu" (%h) module "blocks.0"
//   fsdp.loss %l : tensor<f32>
//   %g = fsdp.aten "aten::threshold_backward" (%d, %a) ...   // backward uses %a
//
// After: only %x (the unit's input) lives across the loss.
//
//   %h = fsdp.aten "aten::mm" (%x, %w) module "blocks.0"
//   %a = fsdp.aten "aten::relu" (%h) module "blocks.0"
//   fsdp.loss %l : tensor<f32>
//   %h2 = fsdp.aten "aten::mm" (%x, %w) module "blocks.0"    // recomputed
//   %a2 = fsdp.aten "aten::relu" (%h2) module "blocks.0"
//   %g = fsdp.aten "aten::threshold_backward" (%d, %a2) ...
//
// The model's own checkpoint regions (calls marked `checkpoint N`, from
// torch.utils.checkpoint) are recomputed the same way, each on its own,
// whether or not units are named: `... module "blocks.0.mlp" checkpoint 0`
// before the loss is cloned before its first backward reader.
//
// With policy=ops, attention results and every odd matrix product's (mm or
// addmm) result are saved instead: the clones start from them.
//
// Test: test/Transforms/activation-checkpoint.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Analysis/Time.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_ACTIVATIONCHECKPOINTPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

bool inUnit(StringRef module, StringRef unit) {
  return module == unit || module.starts_with((unit + ".").str());
}

/// Recomputes the saved forward values of one set of forward calls (a
/// unit's, or one checkpoint region's) in one step.
class Recomputer {
public:
  Recomputer(Step &step, llvm::function_ref<bool(AtenOp)> covers, bool saveComputeOps)
      : step(step), covers(covers), saveComputeOps(saveComputeOps) {}

  void run() {
    // The recomputable forward ops, in order.
    llvm::SetVector<Operation *> forward;
    for (Operation &op : step.body()) {
      if (&op == step.loss.getOperation())
        break;
      auto aten = dyn_cast<AtenOp>(op);
      if (aten && covers(aten) && !aten.getRandom())
        forward.insert(&op);
    }
    // policy=ops: what stays saved, so the recomputation starts from it.
    llvm::SmallPtrSet<Operation *, 16> kept;
    int64_t matmuls = 0;
    for (Operation *op : forward) {
      StringRef callee = cast<AtenOp>(op).getCallee();
      if (saveComputeOps && (workOf(op).kind == OpWork::Attention ||
                             ((callee == "aten::mm" || callee == "aten::addmm") && ++matmuls % 2 == 1)))
        kept.insert(op);
    }
    // Forward values the backward reads, and the first backward reader.
    SmallVector<Value> saved;
    Operation *firstBackwardUse = nullptr;
    for (Operation *op : forward) {
      if (kept.contains(op))
        continue;
      for (Value result : op->getResults()) {
        Operation *user = firstUser(step.body(), result,
                                    [&](Operation *user) { return step.isBackward(user); });
        if (!user)
          continue;
        saved.push_back(result);
        if (!firstBackwardUse || user->isBeforeInBlock(firstBackwardUse))
          firstBackwardUse = user;
      }
    }
    if (saved.empty())
      return;
    // The forward ops those values need, cloned in order before that reader.
    llvm::SetVector<Operation *> needed;
    SmallVector<Operation *> worklist;
    for (Value value : saved)
      worklist.push_back(value.getDefiningOp());
    while (!worklist.empty()) {
      Operation *op = worklist.pop_back_val();
      if (!forward.contains(op) || kept.contains(op) || !needed.insert(op))
        continue;
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp())
          worklist.push_back(def);
    }
    OpBuilder builder(firstBackwardUse);
    IRMapping recomputed;
    for (Operation *op : forward)
      if (needed.contains(op))
        cloneRecomputed(builder, *op, recomputed);
    // The clones read the mapped values, so every backward use left is a reader.
    for (Value value : saved)
      value.replaceUsesWithIf(recomputed.lookup(value), [&](OpOperand &use) {
        return step.isBackward(use.getOwner());
      });
  }

private:
  Step &step;
  llvm::function_ref<bool(AtenOp)> covers;
  bool saveComputeOps;
};

/// The checkpoint regions of `step`'s forward, in order; fails where a
/// backward call is marked as in one.
FailureOr<SmallVector<int64_t>> regionsOf(Step &step) {
  llvm::SetVector<int64_t, SmallVector<int64_t>> regions;
  bool backward = false;
  for (Operation &op : step.body()) {
    if (&op == step.loss.getOperation())
      backward = true;
    auto aten = dyn_cast<AtenOp>(op);
    std::optional<int64_t> region = aten ? aten.getCheckpoint() : std::nullopt;
    if (!region)
      continue;
    if (backward)
      return aten.emitOpError() << "is a backward call marked as in checkpoint region " << *region
                                << "; regions mark the forward calls that backward recomputes";
    regions.insert(*region);
  }
  return regions.takeVector();
}

struct ActivationCheckpointPass
    : public fsdp::impl::ActivationCheckpointPassBase<ActivationCheckpointPass> {
  using ActivationCheckpointPassBase::ActivationCheckpointPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (policy != "full" && policy != "ops") {
      module.emitError() << "activation checkpointing: unknown policy '" << policy << "'; use full or ops";
      return signalPassFailure();
    }
    SmallVector<Step> steps = collectSteps(module);
    SmallVector<SmallVector<int64_t>> regions;
    bool anyRegion = false;
    for (Step &step : steps) {
      FailureOr<SmallVector<int64_t>> found = regionsOf(step);
      if (failed(found))
        return signalPassFailure();
      anyRegion |= !found->empty();
      regions.push_back(std::move(*found));
    }
    if (units.empty() && !anyRegion) {
      if (policy == "full")
        return; // nothing to recompute
      module.emitError() << "activation checkpointing: policy '" << policy
                         << "' applies to the units it recomputes and to the model's checkpoint regions; no "
                            "unit is named (checkpoint=...) and the model checkpoints nothing";
      return signalPassFailure();
    }
    // Modules recompute one by one: a unit grouped of several
    // (fsdp-group-units) recomputes each of its members.
    SmallVector<std::string> chosen;
    llvm::StringSet<> known;
    bool all = llvm::is_contained(units, "*");
    for (UnitOp unit : module.getOps<UnitOp>()) {
      if (unit.getRoot()) {
        if (llvm::is_contained(units, unit.getSymName())) {
          unit.emitError() << "activation checkpointing cannot recompute the root unit: it holds the "
                              "loss; name the units inside it";
          return signalPassFailure();
        }
        continue;
      }
      bool named = all || llvm::is_contained(units, unit.getSymName());
      known.insert(unit.getSymName());
      for (StringRef path : unit.getModulePaths()) {
        known.insert(path);
        if (named || llvm::is_contained(units, path))
          chosen.push_back(path.str());
      }
    }
    for (const std::string &name : units)
      if (name != "*" && !known.contains(name)) {
        module.emitError() << "activation checkpointing names unknown unit '" << name << "'";
        return signalPassFailure();
      }
    for (auto [step, stepRegions] : llvm::zip(steps, regions)) {
      for (const std::string &unit : chosen)
        Recomputer(step, [&](AtenOp op) { return op.getModule() && inUnit(*op.getModule(), unit); },
                   policy == "ops")
            .run();
      // After the units: a region inside a recomputed unit has nothing
      // saved left to recompute.
      for (int64_t region : stepRegions)
        Recomputer(step, [&](AtenOp op) { return op.getCheckpoint() == region; }, policy == "ops").run();
    }
  }
};

} // namespace
