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
// Only operators in `ops` (cheap: pointwise activations, mul, layer and RMS norms) and
// only when every tensor they read is read by backward anyway or recomputed
// itself (a chain, such as silu then mul, recomputes together): what is saved
// shrinks.
//
// Test: test/Transforms/selective-recompute.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
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
    // Candidates in program order, each joined to the candidates whose
    // results it reads: a chain recomputes together.
    SmallVector<AtenOp> candidates;
    for (Operation &op : step.body()) {
      if (&op == step.loss.getOperation())
        break;
      if (auto aten = dyn_cast<AtenOp>(op); aten && isCandidate(aten)) {
        unsigned index = candidates.size();
        candidates.push_back(aten);
        chainOf.push_back(index);
        for (Value input : aten.getInputs())
          if (auto producer = recomputedBy.find(input); producer != recomputedBy.end())
            join(producer->second, index);
        for (Value alias : aliasesOf(aten))
          recomputedBy[alias] = index;
      }
    }
    llvm::MapVector<unsigned, SmallVector<AtenOp>> chains;
    for (unsigned index = 0; index < candidates.size(); ++index)
      chains[root(index)].push_back(candidates[index]);
    for (auto &chain : chains)
      recompute(chain.second);
  }

private:
  bool readInBackward(Value value) {
    return llvm::any_of(value.getUsers(), [&](Operation *user) { return step.isBackward(user); });
  }

  /// The op's results and the views made of them: backward often reads a
  /// view (a reshape feeding a matmul) rather than the result itself.
  SmallVector<Value> aliasesOf(AtenOp op) {
    SmallVector<Value> aliases;
    for (Value result : op.getOutputs())
      llvm::append_range(aliases, viewClosure(result));
    return aliases;
  }

  /// A cheap op whose result backward reads, and whose every input is kept
  /// for backward anyway or recomputed itself.
  bool isCandidate(AtenOp op) {
    if (op.getRandom() || !llvm::is_contained(ops, op.getCallee().str()))
      return false;
    if (!llvm::any_of(aliasesOf(op), [&](Value alias) { return readInBackward(alias); }))
      return false;
    return llvm::all_of(op.getInputs(), [&](Value input) {
      return !isa<RankedTensorType>(input.getType()) || readInBackward(input) || recomputedBy.count(input);
    });
  }

  unsigned root(unsigned index) {
    while (chainOf[index] != index)
      index = chainOf[index] = chainOf[chainOf[index]];
    return index;
  }
  void join(unsigned a, unsigned b) { chainOf[root(b)] = root(a); }

  /// Clones the chain's ops in program order, with the views of their
  /// results made in forward, before the first backward reader of any, and
  /// points backward's readers at the clones.
  void recompute(ArrayRef<AtenOp> chain) {
    SmallVector<Value> aliases;
    for (AtenOp op : chain)
      llvm::append_range(aliases, aliasesOf(op));
    llvm::SmallPtrSet<Value, 8> aliasSet(aliases.begin(), aliases.end());
    Operation *first = firstUser(step.body(), aliases, [&](Operation *user) { return step.isBackward(user); });
    OpBuilder builder(first);
    IRMapping mapping;
    llvm::SmallPtrSet<Operation *, 8> members;
    for (AtenOp op : chain)
      members.insert(op);
    for (Operation *op = chain.front(); op && op != step.loss.getOperation(); op = op->getNextNode())
      if (members.contains(op) || (isViewOf(op) && aliasSet.contains(op->getOperand(0))))
        cloneRecomputed(builder, *op, mapping);
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
  SmallVector<unsigned> chainOf;                // union-find over candidates
  llvm::DenseMap<Value, unsigned> recomputedBy; // alias -> its candidate
};

struct SelectiveRecomputePass
    : public fsdp::impl::SelectiveRecomputePassBase<SelectiveRecomputePass> {
  using SelectiveRecomputePassBase::SelectiveRecomputePassBase;

  void runOnOperation() override {
    SmallVector<std::string> chosen(ops.begin(), ops.end());
    if (chosen.empty())
      chosen = {"aten::gelu", "aten::relu", "aten::silu", "aten::sigmoid", "aten::tanh",
                "aten::native_layer_norm", "aten::_fused_rms_norm", "aten::mul.Tensor"};
    for (Step &step : collectSteps(getOperation()))
      SelectiveRecomputer(step, chosen).run();
  }
};

} // namespace
