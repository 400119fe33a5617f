//===- SelectiveRecompute.cpp - recompute cheap ops instead of saving them ===//
//
// Before: gelu's result is saved for backward, and so is its input (gelu's
// own backward reads it).
//
//   %h = fsdp.aten "aten::addmm" (%b, %x, %w) ...
//   %y = fsdp.aten "aten::gelu" (%h) args [0 : index, "none"] ...
//   fsdp.loss %l : tensor<f32>
//   %gw = fsdp.aten "aten::mm" (%gt, %y) ...              // backward reads %y
//   %gh = fsdp.aten "aten::gelu_backward" (%gy, %h) ...   // and %h
//
// After: %y dies in forward; backward recomputes it from %h, which it keeps
// anyway, right before its first reader.
//
//   %h = fsdp.aten "aten::addmm" (%b, %x, %w) ...
//   %y = fsdp.aten "aten::gelu" (%h) args [0 : index, "none"] ...
//   fsdp.loss %l : tensor<f32>
//   %y2 = fsdp.aten "aten::gelu" (%h) args [0 : index, "none"] ...
//   %gw = fsdp.aten "aten::mm" (%gt, %y2) ...
//   %gh = fsdp.aten "aten::gelu_backward" (%gy, %h) ...
//
// Only operators in `ops` (cheap: pointwise activations, layer norm) and only
// when every tensor they read is read by backward anyway, so the recompute
// never extends a lifetime: what is saved shrinks, nothing grows.
//
// Test: test/Transforms/selective-recompute.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_SELECTIVERECOMPUTEPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

class SelectiveRecomputer {
public:
  SelectiveRecomputer(Step &step, ArrayRef<std::string> ops) : step(step), ops(ops) {}

  void run() {
    SmallVector<AtenOp> candidates;
    for (Operation &op : step.body()) {
      if (&op == step.loss.getOperation())
        break;
      if (auto aten = dyn_cast<AtenOp>(op); aten && isCandidate(aten))
        candidates.push_back(aten);
    }
    for (AtenOp op : candidates)
      recompute(op);
  }

private:
  bool readInBackward(Value value, Operation *except = nullptr) {
    return llvm::any_of(value.getUsers(), [&](Operation *user) {
      return user != except && step.isBackward(user);
    });
  }

  /// The op's results and the views made of them: backward often reads a
  /// view (a reshape feeding a matmul) rather than the result itself.
  SmallVector<Value> aliasesOf(AtenOp op) {
    SmallVector<Value> aliases;
    for (Value result : op.getOutputs())
      llvm::append_range(aliases, viewClosure(result));
    return aliases;
  }

  bool isCandidate(AtenOp op) {
    if (op.getRandom() || !llvm::is_contained(ops, op.getCallee().str()))
      return false;
    if (!llvm::any_of(aliasesOf(op), [&](Value alias) { return readInBackward(alias); }))
      return false;
    return llvm::all_of(op.getInputs(), [&](Value input) {
      return !isa<RankedTensorType>(input.getType()) || readInBackward(input);
    });
  }

  /// Clones the op, and the views of its results that backward reads (or
  /// makes further views of), before the first backward reader of any.
  void recompute(AtenOp op) {
    SmallVector<Value> aliases = aliasesOf(op);
    llvm::SmallPtrSet<Value, 8> aliasSet(aliases.begin(), aliases.end());
    Operation *first = nullptr;
    for (Value alias : aliases)
      if (Operation *user = firstUser(step.body(), alias,
                                      [&](Operation *user) { return step.isBackward(user); }))
        if (!first || user->isBeforeInBlock(first))
          first = user;
    OpBuilder builder(first);
    IRMapping mapping;
    builder.clone(*op, mapping);
    // Forward views in program order, each after the value it views.
    for (Operation *view = op->getNextNode(); view && view != step.loss.getOperation();
         view = view->getNextNode())
      if (isViewOf(view) && aliasSet.contains(view->getOperand(0)))
        builder.clone(*view, mapping);
    // Views made in backward are themselves backward readers: they now view
    // the clone, and need no clone of their own.
    for (Value alias : aliases)
      if (Value again = mapping.lookupOrNull(alias))
        alias.replaceUsesWithIf(again, [&](OpOperand &use) {
          return step.isBackward(use.getOwner());
        });
  }

  Step &step;
  ArrayRef<std::string> ops;
};

struct SelectiveRecomputePass
    : public fsdp::impl::SelectiveRecomputePassBase<SelectiveRecomputePass> {
  using SelectiveRecomputePassBase::SelectiveRecomputePassBase;

  void runOnOperation() override {
    SmallVector<std::string> chosen(ops.begin(), ops.end());
    if (chosen.empty())
      chosen = {"aten::gelu", "aten::relu", "aten::silu", "aten::sigmoid", "aten::tanh",
                "aten::native_layer_norm"};
    for (Step &step : collectSteps(getOperation()))
      SelectiveRecomputer(step, chosen).run();
  }
};

} // namespace
