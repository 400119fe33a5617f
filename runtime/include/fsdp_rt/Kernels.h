//===- Kernels.h - launching a program's generated kernels ------*- C++ -*-===//
//
// A generated elementwise kernel (KernelSpec) runs through PyTorch's
// jiterator: compiled with NVRTC the first time a process launches it (and
// kept in torch's kernel cache, ~/.cache/torch/kernels), then launched on
// the current CUDA stream over TensorIterator, which broadcasts the inputs
// and allocates the outputs in their layout. The runtime links it only
// where the torch it builds against has CUDA (libtorch_cuda).
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_KERNELS_H
#define FSDP_RT_KERNELS_H

#include "fsdp_rt/Program.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace fsdp_rt {

/// The profiler's name for a generated kernel's launch (a `cpu_op` around
/// it, as ATen's calls have), so that a measured trace attributes the kernel.
inline constexpr const char *kKernelLaunchRecord = "fsdp::pointwise";

/// Whether this runtime can launch generated kernels (built against a torch
/// with CUDA).
bool canLaunchKernels();

/// Runs `kernel` over `inputs` (CUDA tensors of one dtype) and returns its
/// outputs; throws std::runtime_error with the reason otherwise.
std::vector<at::Tensor> launchKernel(const KernelSpec &kernel, const std::vector<at::Tensor> &inputs);

} // namespace fsdp_rt

#endif // FSDP_RT_KERNELS_H
