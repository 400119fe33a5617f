//===- PlanLifetimes.cpp - release every value after its last use ---------===//
//
// Before:
//
//   %h = fsdp.aten "aten::mm" (%x, %w) ...
//   %y = fsdp.aten "aten::gelu" (%h) ...
//   %z = fsdp.aten "aten::mul" (%y, %y) ...
//   fsdp.loss %z : tensor<f32>
//
// After:
//
//   %h = fsdp.aten "aten::mm" (%x, %w) ...
//   fsdp.release %x : tensor<8x4xf32>
//   %y = fsdp.aten "aten::gelu" (%h) ...
//   fsdp.release %h : tensor<8x10xf32>
//   %z = fsdp.aten "aten::mul" (%y, %y) ...
//   fsdp.release %y : tensor<8x10xf32>
//   fsdp.loss %z : tensor<f32>
//   fsdp.release %z : tensor<f32>
//
// Gathered buffers are left to their fsdp.reshard. The runtime drops each
// value at its release and the memory report frees it there, so both read
// the same lifetimes. Values a function returns are never released.
//
// Test: test/Transforms/plan-lifetimes.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_PLANLIFETIMESPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Places the releases of one function body.
class LifetimePlanner {
public:
  explicit LifetimePlanner(Block &body) : body(body) {}

  void run() {
    for (BlockArgument arg : body.getArguments())
      plan(arg);
    for (Operation &op : body)
      for (Value result : op.getResults())
        plan(result);
    OpBuilder builder(body.getParentOp()->getContext());
    for (auto &[after, values] : releasesAfter) {
      if (after)
        builder.setInsertionPointAfter(after);
      else
        builder.setInsertionPointToStart(&body);
      Location loc = after ? after->getLoc() : body.getParentOp()->getLoc();
      ReleaseOp::create(builder, loc, values);
    }
  }

private:
  /// Records where `value` dies: after its last user, or at its definition
  /// when nothing reads it.
  void plan(Value value) {
    if (!isa<RankedTensorType>(value.getType()) || isGatheredBuffer(value))
      return;
    Operation *last = nullptr;
    for (Operation *user : value.getUsers()) {
      if (isa<ReleaseOp>(user))
        return; // already planned
      Operation *ancestor = body.findAncestorOpInBlock(*user);
      if (!last || last->isBeforeInBlock(ancestor))
        last = ancestor;
    }
    if (last && last->hasTrait<OpTrait::IsTerminator>())
      return; // returned: the caller owns it
    if (!last)
      last = value.getDefiningOp();
    releasesAfter[last].push_back(value);
  }

  Block &body;
  llvm::MapVector<Operation *, SmallVector<Value>> releasesAfter;
};

struct PlanLifetimesPass : public fsdp::impl::PlanLifetimesPassBase<PlanLifetimesPass> {
  void runOnOperation() override {
    getOperation().walk([](func::FuncOp func) {
      if (!func.isExternal())
        LifetimePlanner(func.getBody().front()).run();
    });
  }
};

} // namespace
