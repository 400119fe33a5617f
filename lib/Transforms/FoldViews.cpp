//===- FoldViews.cpp - compose chains of views ------------------------------===//
//
// Before: a captured backward transposes transposes and reshapes reshapes;
// each view is one more call for the runtime to dispatch, and on a GPU a
// small model's step is bound by those calls.
//
//   %t = fsdp.aten "aten::permute" (%w) args [0 : index, [1, 0]] : (tensor<4x8xf32>) -> tensor<8x4xf32>
//   %u = fsdp.aten "aten::permute" (%t) args [0 : index, [1, 0]] : (tensor<8x4xf32>) -> tensor<4x8xf32>
//   %v = fsdp.aten "aten::view" (%x) args [0 : index, [2, 4, 8]] : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
//   %y = fsdp.aten "aten::view" (%v) args [0 : index, [64]] : (tensor<2x4x8xf32>) -> tensor<64xf32>
//   %a = fsdp.aten "aten::alias" (%y) : (tensor<64xf32>) -> tensor<64xf32>
//
// After: a reshape of a reshape (or of a squeeze or unsqueeze, which only
// change the shape; an unsqueeze of a reshape becomes a reshape), or a
// permute of a permute, is one view of
// the base (the inner view goes once nothing else reads it); a view that
// returns its input's shape unchanged (a permute by the identity, a view or
// expand to the same shape, an alias) is its input. Uses of %u read %w, uses
// of %a read %y:
//
//   %y = fsdp.aten "aten::view" (%x) args [0 : index, [64]] : (tensor<8x8xf32>) -> tensor<64xf32>
//
// Capture is functional (no in-place operator), so a view and its base hold
// the same values wherever they are read. Composing is valid for strided
// views: a view of a view of x addresses x's memory with one stride per
// dimension, which is what a view of x computes.
//
// Test: test/Transforms/fold-views.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/Sequence.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_FOLDVIEWSPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// A view that changes only the shape, never the order of elements: a
/// reshape, or dimensions of size 1 added or dropped.
bool isShapeOnly(AtenOp op) {
  return op && op.getInputs().size() == 1 && op->getNumResults() == 1 &&
         (isReshape(op) || llvm::is_contained({StringRef("aten::unsqueeze"), StringRef("aten::squeeze"),
                                               StringRef("aten::squeeze.dim"), StringRef("aten::squeeze.dims")},
                                              op.getCallee()));
}
bool isPermute(AtenOp op) { return op && op.getCallee() == "aten::permute"; }

/// The integer list at `args[1]` of a view or permute whose `args[0]` is
/// its only operand; nullopt where the call has another form.
std::optional<SmallVector<int64_t>> listArgument(AtenOp op) {
  ArrayAttr args = op.getArgsAttr();
  if (op.getInputs().size() != 1 || op->getNumResults() != 1 || !args || args.size() != 2)
    return std::nullopt;
  return integerListLiteral(op, 1);
}

/// A permutation's dimensions in [0, rank), or nullopt if it is not one.
std::optional<SmallVector<int64_t>> permutation(AtenOp op) {
  std::optional<SmallVector<int64_t>> dims = listArgument(op);
  auto type = dyn_cast<RankedTensorType>(op.getInputs()[0].getType());
  if (!dims || !type || static_cast<int64_t>(dims->size()) != type.getRank())
    return std::nullopt;
  SmallVector<bool> seen(dims->size(), false);
  for (int64_t &dim : *dims) {
    if (dim < 0)
      dim += type.getRank();
    if (dim < 0 || dim >= type.getRank() || seen[dim])
      return std::nullopt;
    seen[dim] = true;
  }
  return dims;
}

void setListArgument(AtenOp op, ArrayRef<int64_t> values) {
  Builder builder(op.getContext());
  op.setArgsAttr(builder.getArrayAttr({op.getArgsAttr()[0], integerListAttr(builder, values)}));
}

/// Makes `op` read the input of the view it reads, where both change only
/// the shape (the pair is one reshape of the inner view's input; an
/// unsqueeze or squeeze of a reshape becomes that reshape) or both are
/// permutes; the inner view goes once nothing reads it.
void composeWithInner(AtenOp op) {
  auto inner = op.getInputs()[0].getDefiningOp<AtenOp>();
  if (!inner)
    return;
  if (isShapeOnly(op) && isShapeOnly(inner) && (isReshape(op) || isReshape(inner))) {
    if (!isReshape(op)) {
      op.setCalleeAttr(StringAttr::get(op.getContext(), "aten::view"));
      setListArgument(op, cast<RankedTensorType>(op->getResult(0).getType()).getShape());
    }
    op->setOperand(0, inner.getInputs()[0]);
    if (inner->use_empty())
      inner->erase();
    return;
  }
  if (!listArgument(op) || !listArgument(inner))
    return;
  if (isPermute(op) && isPermute(inner)) {
    std::optional<SmallVector<int64_t>> outer = permutation(op), first = permutation(inner);
    if (!outer || !first)
      return;
    SmallVector<int64_t> composed;
    for (int64_t dim : *outer)
      composed.push_back((*first)[dim]);
    setListArgument(op, composed);
  } else if (!isReshape(op) || !isReshape(inner)) {
    return;
  }
  op->setOperand(0, inner.getInputs()[0]);
  if (inner->use_empty())
    inner->erase();
}

/// Whether `op` returns its input unchanged: same type, and a view that
/// moves nothing.
bool returnsItsInput(AtenOp op) {
  if (op.getInputs().size() != 1 || op->getNumResults() != 1 ||
      op.getInputs()[0].getType() != op->getResult(0).getType())
    return false;
  StringRef callee = op.getCallee();
  if (callee == "aten::alias" || callee == "aten::expand")
    return true;
  if (isReshape(op))
    return true;
  if (isPermute(op)) {
    std::optional<SmallVector<int64_t>> dims = permutation(op);
    return dims && llvm::equal(*dims, llvm::seq<int64_t>(0, dims->size()));
  }
  return false;
}

struct FoldViewsPass : public fsdp::impl::FoldViewsPassBase<FoldViewsPass> {
  using FoldViewsPassBase::FoldViewsPassBase;

  void runOnOperation() override {
    SmallVector<AtenOp> views;
    getOperation().walk([&](AtenOp op) {
      if (isViewOf(op))
        views.push_back(op);
    });
    // In program order: an outer view composes with an inner one that has
    // already absorbed the views before it.
    for (AtenOp op : views) {
      composeWithInner(op);
      if (returnsItsInput(op)) {
        op->getResult(0).replaceAllUsesWith(op.getInputs()[0]);
        op->erase();
      }
    }
  }
};

} // namespace
