//===- Pointwise.h - ATen calls a generated kernel computes per element -*- C++ -*-===//
//
// The one table of elementwise ATen operators that fsdp.pointwise may hold:
// which calls qualify (fsdp-fuse-pointwise and the op's verifier ask
// `pointwiseRefusal`) and how each computes one element (the kernel printer
// asks `pointwiseExpression`), in `float` whatever the tensors' dtype, as
// ATen's own kernels compute bf16 and f16 in float.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_DIALECT_POINTWISE_H
#define FSDP_DIALECT_POINTWISE_H

#include "fsdp/Dialect/FsdpOps.h"

#include <optional>
#include <string>

namespace mlir::fsdp {

/// Why `op` cannot be computed element by element in a generated kernel
/// ("" when it can): an operator outside the table, a literal of the wrong
/// kind or not finite, a result that is not one f32/bf16/f16 tensor (one
/// bool tensor for a comparison, whose operands may be any of the three),
/// an operand of another element type, or a `random` call.
std::string pointwiseRefusal(AtenOp op);

/// The C++ expression of one element of `op`'s result, given the
/// expressions of its operands' elements (`operands[i]` for input i, of
/// type float). `op` must pass `pointwiseRefusal`.
std::string pointwiseExpression(AtenOp op, ArrayRef<std::string> operands);

/// Whether a generated kernel computes in this element type: f32, bf16, f16.
bool isKernelElementType(Type type);

/// The shape `a` and `b` broadcast to, as ATen broadcasts (trailing
/// dimensions aligned, each equal or 1), or nullopt if they do not.
std::optional<SmallVector<int64_t>> broadcastShape(ArrayRef<int64_t> a, ArrayRef<int64_t> b);

} // namespace mlir::fsdp

#endif // FSDP_DIALECT_POINTWISE_H
