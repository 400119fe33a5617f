//===- FsdpOps.h - fsdp dialect operations ----------------------*- C++ -*-===//

#ifndef FSDP_DIALECT_FSDPOPS_H
#define FSDP_DIALECT_FSDPOPS_H

#include "fsdp/Dialect/FsdpDialect.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <optional>

namespace mlir::fsdp {

/// Ops of a training step's body: they must sit somewhere inside a function.
template <typename ConcreteType>
class InFunction : public OpTrait::TraitBase<ConcreteType, InFunction> {
public:
  static LogicalResult verifyTrait(Operation *op) {
    if (!op->getParentOfType<FunctionOpInterface>())
      return op->emitOpError("must be inside a function (a training step)");
    return success();
  }
};

} // namespace mlir::fsdp

#define GET_OP_CLASSES
#include "fsdp/FsdpOps.h.inc"

namespace mlir::fsdp {

/// Whether `op` is an ATen view: its results share its first operand's storage.
bool isViewOf(Operation *op);
/// The literal at schema position `position` of an fsdp.aten op's `args`, if
/// it is of the kind asked for: an integer (an operand reference is not
/// one), a number (integer or float), a list of integers, a bool.
std::optional<int64_t> integerLiteral(AtenOp op, unsigned position);
std::optional<double> numberLiteral(AtenOp op, unsigned position);
std::optional<SmallVector<int64_t>> integerListLiteral(AtenOp op, unsigned position);
std::optional<bool> boolLiteral(AtenOp op, unsigned position);
/// An integer list as an fsdp.aten literal (what integerListLiteral reads).
ArrayAttr integerListAttr(Builder &builder, ArrayRef<int64_t> values);
/// Whether `op` reshapes without reordering: `aten::view` or `_unsafe_view`.
bool isReshape(AtenOp op);
/// A copy of forward op `op` at `builder`'s point for backward to read
/// (operands through `mapping`): marked fsdp.recomputed, and in no
/// checkpoint region, which marks forward calls only.
Operation *cloneRecomputed(OpBuilder &builder, Operation &op, IRMapping &mapping);
/// `aten::view` of `value` to `shape`, in `module`: the caller knows the
/// layout lets ATen reshape it without a copy.
Value createView(OpBuilder &builder, Location loc, Value value, ArrayRef<int64_t> shape, StringAttr module,
                 IntegerAttr checkpoint = {});
/// `value` and every ATen view derived from it, transitively (`value` first):
/// the values that keep its storage alive.
SmallVector<Value> viewClosure(Value value);
/// Whether `value` is a gathered buffer: a result of fsdp.wait on an
/// fsdp.all_gather_start, which only fsdp.reshard frees.
bool isGatheredBuffer(Value value);

} // namespace mlir::fsdp

#endif // FSDP_DIALECT_FSDPOPS_H
