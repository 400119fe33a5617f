//===- ReshardAfterForward.cpp - free gathered parameters -----------------===//
//
// Before (unit @u's weight is used in forward and in backward):
//
//   %w = fsdp.wait %f : !fsdp.future<tensor<10x4xf32>>
//   %y = fsdp.aten "aten::mm" (%x, %w) ...          // last forward use
//   fsdp.loss %l : tensor<f32>
//   %d = fsdp.aten "aten::mm" (%gy, %w) ...         // backward use
//
// After (mode=true):
//
//   %w = fsdp.wait %f : ...
//   %y = fsdp.aten "aten::mm" (%x, %w) ...
//   fsdp.reshard %w : tensor<10x4xf32>               // freed after forward
//   fsdp.loss %l : tensor<f32>
//   %s = fsdp.get_param @w : tensor<3x4xf32>         // gathered again
//   %f2 = fsdp.all_gather_start %s on @fsdp_grid axes = [0] unit @u : ...
//   %w2 = fsdp.wait %f2 : ...
//   %d = fsdp.aten "aten::mm" (%gy, %w2) ...
//   fsdp.reshard %w2 : tensor<10x4xf32>              // freed after backward
//
// With mode=g the forward free keeps `fsdp.all_slice %w` over the inner g
// ranks, and backward gathers from that slice within the smaller group.
//
// Test: test/Transforms/reshard-after-forward.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_RESHARDAFTERFORWARDPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// How a resharded unit keeps its parameters between forward and backward.
struct Policy {
  bool reshard = true;
  int64_t innerGroup = 0; // integer mode: ranks of the smaller group
  bool root = false;
};

class Resharder {
public:
  Resharder(ModuleOp module, Step &step, Policy policy)
      : step(step), policy(policy), builder(module.getContext()) {
    for (UnitOp unit : module.getOps<UnitOp>())
      if (unit.getRoot())
        rootUnits.insert(unit.getSymName());
  }

  LogicalResult run() {
    SmallVector<AllGatherStartOp> gathers(step.body().getOps<AllGatherStartOp>());
    if (policy.reshard)
      for (AllGatherStartOp start : gathers)
        if (failed(splitAcrossLoss(start)))
          return failure();
    // Every gathered buffer is freed after its last use (FSDP2 reshards
    // after backward too).
    for (AllGatherStartOp start : llvm::to_vector(step.body().getOps<AllGatherStartOp>()))
      if (WaitOp wait = waitOf(start))
        for (Value buffer : wait.getResults())
          freeAfterLastUse(buffer, wait);
    return success();
  }

private:
  bool resharded(AllGatherStartOp start) {
    FlatSymbolRefAttr unit = start.getUnitAttr();
    return unit && (policy.root || !rootUnits.contains(unit.getValue()));
  }

  static bool isFree(Operation *op) { return isa<ReshardOp>(op); }

  /// Points backward readers of `buffer` and of its forward-made views at
  /// `gathered`, re-making those views from it right after `after`.
  void redirectBackwardReaders(Value buffer, Value gathered, Operation *after) {
    SmallVector<Value> aliases = viewClosure(buffer);
    SmallVector<Operation *> forwardViews;
    for (Value alias : aliases)
      if (Operation *def = alias.getDefiningOp(); def && alias != buffer && !step.isBackward(def))
        if (!llvm::is_contained(forwardViews, def))
          forwardViews.push_back(def);
    llvm::sort(forwardViews, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    IRMapping remade;
    remade.map(buffer, gathered);
    builder.setInsertionPointAfter(after);
    for (Operation *view : forwardViews)
      builder.clone(*view, remade);
    for (Value alias : aliases) {
      Value replacement = remade.lookupOrNull(alias);
      if (!replacement)
        continue;
      alias.replaceUsesWithIf(replacement, [&](OpOperand &use) {
        Operation *owner = use.getOwner();
        return step.isBackward(owner) && owner != after && !remade.contains(owner->getResult(0)) &&
               !llvm::is_contained(forwardViews, owner);
      });
    }
    for (Operation *view : llvm::reverse(forwardViews))
      if (Operation *clone = remade.lookupOrNull(view->getResult(0)).getDefiningOp())
        if (clone->use_empty())
          clone->erase();
  }

  /// Frees a buffer used on both sides of the loss after forward, and
  /// gathers it again for backward.
  LogicalResult splitAcrossLoss(AllGatherStartOp start) {
    WaitOp wait = waitOf(start);
    if (!wait || !resharded(start) || step.isBackward(start))
      return success();
    for (auto [index, buffer] : llvm::enumerate(wait.getResults())) {
      auto read = start.getInputs()[index].getDefiningOp<GetParamOp>();
      Operation *lastForward = lastStorageUser(step.body(), buffer, [&](Operation *user) {
        return !step.isBackward(user) && !isFree(user);
      });
      Operation *firstBackward = firstStorageUser(step.body(), buffer, [&](Operation *user) {
        return step.isBackward(user) && !isFree(user);
      });
      if (!read || !lastForward || !firstBackward)
        continue;
      Location loc = buffer.getLoc();
      builder.setInsertionPointAfter(lastForward);
      Value kept;
      SmallVector<int16_t> axes(start.getGridAxes());
      if (policy.innerGroup) {
        auto grid = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(start, start.getGridAttr());
        if (axes.size() < 2 || grid.getShape()[axes.back()] != policy.innerGroup)
          return start.emitOpError() << "reshard-after-forward=" << policy.innerGroup
                                     << " needs parameters sharded with reshard-group="
                                     << policy.innerGroup << " (fsdp-shard-parameters)";
        auto full = cast<RankedTensorType>(buffer.getType());
        SmallVector<int64_t> shape(full.getShape());
        shape[0] = (shape[0] + policy.innerGroup - 1) / policy.innerGroup;
        axes = {axes.back()};
        kept = AllSliceOp::create(builder, loc, RankedTensorType::get(shape, full.getElementType()),
                                  buffer, start.getGridAttr(), builder.getDenseI16ArrayAttr(axes));
      }
      ReshardOp::create(builder, loc, ValueRange{buffer});

      builder.setInsertionPoint(firstBackward);
      if (!kept)
        kept = GetParamOp::create(builder, loc, read.getResult().getType(), read.getNameAttr());
      auto again = AllGatherStartOp::create(
          builder, loc, FutureType::get(builder.getContext(), {buffer.getType()}), ValueRange{kept},
          start.getGridAttr(), builder.getDenseI16ArrayAttr(axes), start.getUnitAttr(), IntegerAttr());
      auto wait = WaitOp::create(builder, loc, again.getFuture());
      redirectBackwardReaders(buffer, wait.getResult(0), wait);
    }
    return success();
  }

  void freeAfterLastUse(Value buffer, WaitOp wait) {
    if (llvm::any_of(buffer.getUsers(), isFree))
      return;
    Operation *last = lastStorageUser(step.body(), buffer, [](Operation *) { return true; });
    builder.setInsertionPointAfter(last ? last : wait.getOperation());
    ReshardOp::create(builder, buffer.getLoc(), ValueRange{buffer});
  }

  Step &step;
  Policy policy;
  OpBuilder builder;
  llvm::StringSet<> rootUnits;
};

struct ReshardAfterForwardPass
    : public fsdp::impl::ReshardAfterForwardPassBase<ReshardAfterForwardPass> {
  using ReshardAfterForwardPassBase::ReshardAfterForwardPassBase;

  void runOnOperation() override {
    Policy policy;
    policy.root = root;
    if (mode == "false") {
      policy.reshard = false;
    } else if (mode != "true") {
      if (StringRef(mode).getAsInteger(10, policy.innerGroup) || policy.innerGroup < 1) {
        getOperation().emitError() << "reshard-after-forward mode must be true, false or a "
                                      "positive integer, got '" << mode << "'";
        return signalPassFailure();
      }
    }
    for (Step &step : collectSteps(getOperation()))
      if (failed(Resharder(getOperation(), step, policy).run()))
        return signalPassFailure();
  }
};

} // namespace
