//===- TestEagerStrides.cpp - the layout analysis, written out for tests --===//
//
// Before:
//
//   %p = fsdp.aten "aten::permute"(%x) args [0 : index, [1, 0]] : (tensor<4x8xf32>) -> tensor<8x4xf32>
//
// After (%x row-major):
//
//   %p = fsdp.aten "aten::permute"(%x) args [0 : index, [1, 0]] {test.eager_strides = [array<i64: 1, 8>]} : ...
//
// An op whose result no rule covers gets `unit` in that result's place.
//
// Test: test/Transforms/test-eager-strides.mlir; python/tests/test_eager_strides.py
// holds the annotations against ATen.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Strides.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_TESTEAGERSTRIDESPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Sets `test.eager_strides` on every op of `body` with tensor results.
void annotateEagerStrides(Block &body) {
  EagerStrides strides;
  Builder builder(body.getParentOp()->getContext());
  for (Operation &op : body) {
    if (!llvm::any_of(op.getResultTypes(), [](Type type) { return isa<RankedTensorType>(type); }))
      continue;
    SmallVector<Attribute> entries;
    for (Value result : op.getResults()) {
      std::optional<Strides> known = strides.of(result);
      entries.push_back(known ? Attribute(builder.getDenseI64ArrayAttr(*known)) : Attribute(builder.getUnitAttr()));
    }
    op.setAttr("test.eager_strides", builder.getArrayAttr(entries));
  }
}

struct TestEagerStridesPass : public fsdp::impl::TestEagerStridesPassBase<TestEagerStridesPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal())
        annotateEagerStrides(func.getBody().front());
  }
};

} // namespace
