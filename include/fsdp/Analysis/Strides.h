//===- Strides.h - the strides eager PyTorch gives a step's tensors -*- C++ -*-===//
//
// A kernel that fuses several elementwise calls allocates its results as
// TensorIterator allocates them from the kernel's inputs; a later `view` of
// such a result is valid only if its strides are the ones eager's calls
// would have given it. These are ATen's allocation rules, in elements:
// what a view makes of its input's strides, and the order TensorIterator
// sorts an elementwise call's dimensions in before it allocates a dense
// result in that order.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_ANALYSIS_STRIDES_H
#define FSDP_ANALYSIS_STRIDES_H

#include "fsdp/Dialect/FsdpOps.h"

#include <optional>

namespace mlir::fsdp {

using Strides = SmallVector<int64_t, 6>;

/// Row-major strides of `shape`.
Strides contiguousStrides(ArrayRef<int64_t> shape);

/// The strides `aten::view` gives a tensor of `shape` and `strides`
/// reshaped to `newShape`, or nullopt where ATen refuses the view (it
/// would need a copy).
std::optional<Strides> viewStrides(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides, ArrayRef<int64_t> newShape);

/// A tensor as an elementwise call reads it.
struct StridedOperand {
  ArrayRef<int64_t> shape;
  ArrayRef<int64_t> strides;
};

/// The strides of the result TensorIterator allocates for an elementwise
/// call over `inputs` (in the call's order), broadcast to `shape`.
Strides elementwiseResultStrides(ArrayRef<int64_t> shape, ArrayRef<StridedOperand> inputs);

/// Whether two tensors of `shape` lay out memory alike: equal strides on
/// every dimension longer than 1 (a dimension of size 1 is never stepped).
bool sameLayout(ArrayRef<int64_t> shape, ArrayRef<int64_t> a, ArrayRef<int64_t> b);

/// The strides each tensor value of a step has when eager PyTorch runs it,
/// from the ops that make it: tensors the runtime allocates or hands a
/// function (its batch) are row-major;
/// views follow their input; elementwise calls and `preserve_format` copies
/// (and comparisons) follow TensorIterator; matrix products,
/// concatenations, contiguous copies, identities, layer norms and the fused RMSNorm are
/// row-major; cuDNN attention lays its output out in the query's order of
/// strides and its gradients like their inputs. nullopt where no rule says
/// (other attention kernels, operators not listed).
class EagerStrides {
public:
  std::optional<Strides> of(Value value);
  /// What TensorIterator gives an elementwise call's (or kernel's) result of
  /// `shape` over `inputs`, in their order; nullopt if an input's are unknown.
  std::optional<Strides> elementwise(ValueRange inputs, ArrayRef<int64_t> shape);

private:
  std::optional<Strides> compute(Value value);
  /// What a `preserve_format` copy of `input` (clone, a dtype cast) gets.
  std::optional<Strides> preserved(Value input);

  DenseMap<Value, std::optional<Strides>> known;
};

} // namespace mlir::fsdp

#endif // FSDP_ANALYSIS_STRIDES_H
