//===- PointwiseKernel.h - an fsdp.pointwise body as CUDA source -*- C++ -*-===//

#ifndef FSDP_TARGET_PROGRAM_POINTWISEKERNEL_H
#define FSDP_TARGET_PROGRAM_POINTWISEKERNEL_H

#include "fsdp/Dialect/FsdpOps.h"

#include <string>

namespace mlir::fsdp {

/// The CUDA C++ source of `op`'s kernel in PyTorch's jiterator form: a
/// function template `name<T>(T in0, ..., T& out0, ...)` that computes one
/// element in float, after the helpers the table's expressions call.
std::string pointwiseKernelSource(PointwiseOp op, llvm::StringRef name);

} // namespace mlir::fsdp

#endif // FSDP_TARGET_PROGRAM_POINTWISEKERNEL_H
