//===- SimplifyBackward.cpp - drop the no-op arithmetic of autograd ---------===//
//
// Before: autograd's formulas, decomposed to core ATen, do work that changes
// nothing. The gradient of `x.pow(2)` raises x to the power 1; the gradient
// of two slices of x (rotary positions split the head in halves) scatters
// each half's gradient into its own zero tensor of x's shape and adds both:
//
//   %p  = fsdp.aten "aten::pow.Tensor_Scalar" (%x) args [0 : index, 1.0] : (tensor<8x16xf32>) -> tensor<8x16xf32>
//   %z0 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, ...] : () -> tensor<8x16xf32>
//   %s0 = fsdp.aten "aten::slice_scatter" (%z0, %hi) args [0 : index, 1 : index, 1, 8, 9223372036854775807, 1] ...
//   %a0 = fsdp.aten "aten::add.Tensor" (%g, %s0) args [0 : index, 1 : index, 1] ...
//   %z1 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, ...] : () -> tensor<8x16xf32>
//   %s1 = fsdp.aten "aten::slice_scatter" (%z1, %lo) args [0 : index, 1 : index, 1, 0, 8, 1] ...
//   %a1 = fsdp.aten "aten::add.Tensor" (%a0, %s1) args [0 : index, 1 : index, 1] ...
//
// After: the power is x; scatters into zeros whose slices tile the
// dimension, summed, are the slices side by side (two full-size memsets,
// two full-size scatters and an add become one concatenation):
//
//   %c  = fsdp.aten "aten::cat" (%lo, %hi) args [[0 : index, 1 : index], 1] ...
//   %a1 = fsdp.aten "aten::add.Tensor" (%g, %c) args [0 : index, 1 : index, 1] ...
//
// Exact: x^1 is x, and adding a zero that the other scatter holds at every
// place the first wrote changes no value (up to the sign of a zero sum).
//
// Test: test/Transforms/simplify-backward.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <algorithm>
#include <limits>

namespace mlir::fsdp {
#define GEN_PASS_DEF_SIMPLIFYBACKWARDPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

constexpr int64_t kNoEnd = std::numeric_limits<int64_t>::max();

/// Whether `args[index]` is the literal number `value`, integer or float.
bool isNumber(AtenOp op, unsigned index, double value) { return numberLiteral(op, index) == value; }

/// An `add.Tensor` of two operands with alpha 1.
bool isPlainAdd(AtenOp op) {
  return op && op.getCallee() == "aten::add.Tensor" && op.getInputs().size() == 2 && op->getNumResults() == 1 &&
         isNumber(op, 2, 1.0);
}

/// A zero tensor of `value`'s type, made by `full` with fill 0.
bool isZeros(Value value) {
  auto full = value.getDefiningOp<AtenOp>();
  return full && full.getCallee() == "aten::full" && full.getInputs().empty() && full->getNumResults() == 1 &&
         isNumber(full, 1, 0.0);
}

/// A `slice_scatter` of a source into zeros: the dimension and the
/// half-open range it writes (end clamped to the size), with step 1.
struct ScatterIntoZeros {
  AtenOp op;
  Value source;
  int64_t dim, begin, end;
};

std::optional<ScatterIntoZeros> scatterIntoZeros(Value value) {
  auto op = value.getDefiningOp<AtenOp>();
  if (!op || op.getCallee() != "aten::slice_scatter" || op.getInputs().size() != 2 || !op->hasOneUse() ||
      !isZeros(op.getInputs()[0]) || !op.getInputs()[0].hasOneUse())
    return std::nullopt;
  auto type = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  std::optional<int64_t> dim = integerLiteral(op, 2), begin = integerLiteral(op, 3), end = integerLiteral(op, 4),
                         step = integerLiteral(op, 5);
  if (!type || !dim || !begin || !end || step != 1 || type != op.getInputs()[0].getType())
    return std::nullopt;
  int64_t rank = type.getRank();
  if (*dim < 0)
    *dim += rank;
  if (*dim < 0 || *dim >= rank || type.isDynamicDim(*dim))
    return std::nullopt;
  int64_t size = type.getDimSize(*dim);
  auto clamp = [&](int64_t index) { return std::clamp(index < 0 ? index + size : index, int64_t{0}, size); };
  return ScatterIntoZeros{op, op.getInputs()[1], *dim, clamp(*begin), *end == kNoEnd ? size : clamp(*end)};
}

/// The operand of `add` that is a scatter into zeros, and the other one.
std::optional<std::pair<ScatterIntoZeros, Value>> splitAdd(AtenOp add) {
  for (unsigned index : {1u, 0u})
    if (std::optional<ScatterIntoZeros> scatter = scatterIntoZeros(add.getInputs()[index]))
      return std::make_pair(*scatter, add.getInputs()[1 - index]);
  return std::nullopt;
}

/// outer = add(inner, s1), inner = add(x, s0), where s0 and s1 scatter into
/// zeros along one dimension and their ranges tile it: outer becomes
/// add(x, cat(sources in range order)). Returns the inner add it erased.
Operation *concatenateScatters(AtenOp outer) {
  std::optional<std::pair<ScatterIntoZeros, Value>> last = splitAdd(outer);
  if (!last)
    return nullptr;
  auto inner = last->second.getDefiningOp<AtenOp>();
  if (!isPlainAdd(inner) || !inner->hasOneUse())
    return nullptr;
  std::optional<std::pair<ScatterIntoZeros, Value>> first = splitAdd(inner);
  if (!first)
    return nullptr;
  ScatterIntoZeros low = first->first, high = last->first;
  Value rest = first->second;
  auto type = cast<RankedTensorType>(low.op->getResult(0).getType());
  if (low.dim != high.dim || high.op->getResult(0).getType() != type || outer->getResult(0).getType() != type ||
      rest.getType() != type)
    return nullptr;
  if (low.begin > high.begin)
    std::swap(low, high);
  int64_t size = type.getDimSize(low.dim);
  if (low.begin != 0 || low.end != high.begin || high.end != size || low.end == 0 || high.begin == size)
    return nullptr;

  OpBuilder builder(outer);
  auto cat = AtenOp::create(builder, outer.getLoc(), TypeRange{type}, builder.getStringAttr("aten::cat"),
                            ValueRange{low.source, high.source},
                            builder.getArrayAttr({builder.getArrayAttr({builder.getIndexAttr(0),
                                                                        builder.getIndexAttr(1)}),
                                                  builder.getI64IntegerAttr(low.dim)}),
                            UnitAttr(), low.op.getModuleAttr(), IntegerAttr());
  outer->setOperands({rest, cat->getResult(0)});
  outer.setArgsAttr(builder.getArrayAttr({builder.getIndexAttr(0), builder.getIndexAttr(1),
                                          builder.getI64IntegerAttr(1)}));
  Operation *erased = inner.getOperation();
  inner->erase();
  for (AtenOp scatter : {low.op, high.op}) {
    Operation *zeros = scatter.getInputs()[0].getDefiningOp();
    scatter->erase();
    zeros->erase();
  }
  return erased;
}

/// pow(x, 1) is x.
bool isIdentityPower(AtenOp op) {
  return op.getCallee() == "aten::pow.Tensor_Scalar" && op.getInputs().size() == 1 && op->getNumResults() == 1 &&
         isNumber(op, 1, 1.0) && op.getInputs()[0].getType() == op->getResult(0).getType();
}

struct SimplifyBackwardPass : public fsdp::impl::SimplifyBackwardPassBase<SimplifyBackwardPass> {
  using SimplifyBackwardPassBase::SimplifyBackwardPassBase;

  void runOnOperation() override {
    SmallVector<AtenOp> powers, adds;
    getOperation().walk([&](AtenOp op) {
      if (isIdentityPower(op))
        powers.push_back(op);
      else if (isPlainAdd(op))
        adds.push_back(op);
    });
    for (AtenOp power : powers) {
      power->getResult(0).replaceAllUsesWith(power.getInputs()[0]);
      power->erase();
    }
    // From the last add: a rewrite erases the add before it in the chain,
    // which the walk then skips (compared by address, never dereferenced).
    llvm::SmallPtrSet<Operation *, 16> erased;
    for (AtenOp add : llvm::reverse(adds))
      if (!erased.contains(add.getOperation()))
        if (Operation *inner = concatenateScatters(add))
          erased.insert(inner);
  }
};

} // namespace
