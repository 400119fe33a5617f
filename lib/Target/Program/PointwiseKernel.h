//===- PointwiseKernel.h - an fsdp.pointwise as a kernel entry -*- C++ -*-===//

#ifndef FSDP_TARGET_PROGRAM_POINTWISEKERNEL_H
#define FSDP_TARGET_PROGRAM_POINTWISEKERNEL_H

#include "fsdp/Analysis/Strides.h"
#include "fsdp/Dialect/FsdpOps.h"

#include <string>

namespace mlir::fsdp {

/// The CUDA C++ source of `op`'s element function, `__device__ void
/// name(float in0, ..., float& out0, ...)`, after the helpers it calls.
std::string pointwiseElementSource(PointwiseOp op, llvm::StringRef name);

/// One tensor of a kernel: as it must arrive (or is allocated) and its step
/// in elements along each loop dimension.
struct KernelOperandLayout {
  SmallVector<int64_t> shape, strides, steps;
};

/// How a kernel walks its tensors (docs/program.md, "kernels"): the loop's
/// dimensions innermost first in the outputs' order, merged where every
/// tensor steps through two alike; `vector` elements per thread and
/// iteration (16 bytes, or what divides the innermost dimension); a grid
/// of `block`-thread blocks that covers the loop once.
struct KernelLayout {
  SmallVector<int64_t> extents;
  SmallVector<KernelOperandLayout> inputs, outputs;
  int64_t vector = 1, block = 256, grid = 1;
};

/// `op`'s layout from the strides eager PyTorch gives its inputs (the
/// outputs are allocated as TensorIterator would allocate them, which later
/// views rely on); an error on `op` where an input's strides are not known.
FailureOr<KernelLayout> pointwiseKernelLayout(PointwiseOp op, EagerStrides &strides);

} // namespace mlir::fsdp

#endif // FSDP_TARGET_PROGRAM_POINTWISEKERNEL_H
