//===- FoldAddIntoMatmul.cpp - a sum onto a matrix product is one addmm ---===//
//
// Before: a residual connection, or a gradient summed over two branches,
// adds a full-size tensor to a matrix product's result: one more kernel
// that reads both and writes a third tensor of the same size.
//
//   %m = fsdp.aten "aten::mm" (%a, %b) : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
//   %v = fsdp.aten "aten::view" (%m) args [0 : index, [2, 4, 16]] : (tensor<8x16xf32>) -> tensor<2x4x16xf32>
//   %s = fsdp.aten "aten::add.Tensor" (%x, %v) args [0 : index, 1 : index, 1] : (...) -> tensor<2x4x16xf32>
//
// After: the product accumulates onto the other addend, as BLAS does with
// beta = 1 (ATen first copies the addend into the result: two passes over
// memory instead of the add's three); the sum is the product's only
// allocation, where the product was:
//
//   %x2 = fsdp.aten "aten::view" (%x) args [0 : index, [8, 16]] : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
//   %p = fsdp.aten "aten::addmm" (%x2, %a, %b) args [0 : index, 1 : index, 2 : index, 1, 1] : (...) -> tensor<8x16xf32>
//   %s = fsdp.aten "aten::view" (%p) args [0 : index, [2, 4, 16]] : (tensor<8x16xf32>) -> tensor<2x4x16xf32>
//
// Only where nothing else reads the product or its view, the addend has
// the sum's shape and dtype (no broadcast, no promotion) and eager lays it
// out row-major (so both views are valid and the sum is laid out as
// eager's add lays it out), and the addend exists before the product (the
// product's operands live no longer than they did).
//
// Test: test/Transforms/fold-add-into-matmul.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Strides.h"
#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_FOLDADDINTOMATMULPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// A matrix product with one result, read by `user` alone.
AtenOp productFeeding(Value value, Operation *user) {
  auto product = value.getDefiningOp<AtenOp>();
  if (!product || product.getCallee() != "aten::mm" || product.getInputs().size() != 2 ||
      product->getNumResults() != 1 || !product->getResult(0).hasOneUse() || *product->user_begin() != user)
    return AtenOp();
  return product;
}

/// What one fold rewrites: `add` of `addend` and a product, seen through
/// `reshape` when there is one.
struct Fold {
  AtenOp add, reshape, product;
  Value addend;
};

/// Whether `value` is defined before `op` in `op`'s block (or is one of its
/// arguments).
bool definedBefore(Value value, Operation *op) {
  if (auto argument = dyn_cast<BlockArgument>(value))
    return argument.getOwner() == op->getBlock();
  Operation *def = value.getDefiningOp();
  return def->getBlock() == op->getBlock() && def->isBeforeInBlock(op);
}

std::optional<Fold> foldOf(AtenOp add, EagerStrides &strides) {
  if (add.getCallee() != "aten::add.Tensor" || add.getInputs().size() != 2 || add->getNumResults() != 1 ||
      numberLiteral(add, 2) != 1.0)
    return std::nullopt;
  auto sumType = dyn_cast<RankedTensorType>(add->getResult(0).getType());
  if (!sumType || !sumType.hasStaticShape())
    return std::nullopt;
  for (unsigned side = 0; side < 2; ++side) {
    Value addend = add.getInputs()[1 - side], term = add.getInputs()[side];
    AtenOp reshape = term.getDefiningOp<AtenOp>();
    AtenOp product;
    if (isReshape(reshape) && term.hasOneUse())
      product = productFeeding(reshape.getInputs()[0], reshape);
    else
      product = productFeeding(term, add), reshape = AtenOp();
    if (!product || addend.getType() != sumType || term.getType() != sumType)
      continue;
    auto productType = cast<RankedTensorType>(product->getResult(0).getType());
    if (productType.getElementType() != sumType.getElementType() || !definedBefore(addend, product))
      continue;
    if (product.getCheckpointAttr() != add.getCheckpointAttr())
      continue; // the sum would move into or out of a region the model recomputes
    std::optional<Strides> laidOut = strides.of(addend);
    if (!laidOut || !sameLayout(sumType.getShape(), *laidOut, contiguousStrides(sumType.getShape())))
      continue;
    return Fold{add, reshape, product, addend};
  }
  return std::nullopt;
}

void rewrite(const Fold &fold) {
  AtenOp product = fold.product;
  OpBuilder builder(product);
  Location loc = product.getLoc();
  StringAttr module = product.getModuleAttr();
  IntegerAttr region = product.getCheckpointAttr();
  auto productType = cast<RankedTensorType>(product->getResult(0).getType());
  Value addend = fold.addend;
  if (fold.reshape)
    addend = createView(builder, loc, addend, productType.getShape(), module, region);
  Value a = product.getInputs()[0], b = product.getInputs()[1];
  Value sum = AtenOp::create(builder, loc, TypeRange{productType}, builder.getStringAttr("aten::addmm"),
                             ValueRange{addend, a, b},
                             builder.getArrayAttr({builder.getIndexAttr(0), builder.getIndexAttr(1),
                                                   builder.getIndexAttr(2), builder.getI64IntegerAttr(1),
                                                   builder.getI64IntegerAttr(1)}),
                             UnitAttr(), module, region)
                  ->getResult(0);
  if (fold.reshape)
    sum = createView(builder, loc, sum, cast<RankedTensorType>(fold.add->getResult(0).getType()).getShape(), module,
                     region);
  fold.add->getResult(0).replaceAllUsesWith(sum);
  fold.add->erase();
  if (fold.reshape)
    fold.reshape->erase();
  product->erase();
}

struct FoldAddIntoMatmulPass : public fsdp::impl::FoldAddIntoMatmulPassBase<FoldAddIntoMatmulPass> {
  using FoldAddIntoMatmulPassBase::FoldAddIntoMatmulPassBase;

  void runOnOperation() override {
    SmallVector<AtenOp> adds;
    getOperation().walk([&](AtenOp op) {
      if (op.getCallee() == "aten::add.Tensor")
        adds.push_back(op);
    });
    // In program order, each on the IR as the folds before it left it (a
    // sum can be the next one's addend); strides are looked up afresh, as
    // a fold replaces values.
    for (AtenOp add : adds) {
      EagerStrides strides;
      if (std::optional<Fold> fold = foldOf(add, strides))
        rewrite(*fold);
    }
  }
};

} // namespace
