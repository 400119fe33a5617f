//===- Kernels.cpp - launching a program's generated kernels --------------===//

#include "fsdp_rt/Kernels.h"

#include <ATen/record_function.h>

#include <stdexcept>
#include <string>

#if FSDP_RT_JITERATOR
#include <ATen/cuda/jiterator.h>
#endif

namespace fsdp_rt {

bool canLaunchKernels() { return FSDP_RT_JITERATOR; }

std::vector<at::Tensor> launchKernel(const KernelSpec &kernel, const std::vector<at::Tensor> &inputs) {
  for (const at::Tensor &input : inputs)
    if (!input.is_cuda())
      throw std::runtime_error("kernel " + kernel.name + " reads a tensor on " + input.device().str() +
                               "; generated kernels run on cuda");
#if FSDP_RT_JITERATOR
  RECORD_FUNCTION(kKernelLaunchRecord, c10::ArrayRef<const c10::IValue>{});
  c10::SmallVector<at::Tensor> tensors(inputs.begin(), inputs.end());
  c10::SmallVector<at::Tensor> outputs = at::cuda::CompileAndLaunchKernel(
      kernel.source, kernel.name, kernel.outputs, tensors, /*extra_args=*/{}, /*return_by_ref=*/true);
  return std::vector<at::Tensor>(outputs.begin(), outputs.end());
#else
  throw std::runtime_error("kernel " + kernel.name +
                           ": this runtime was built against a torch without CUDA and cannot launch generated "
                           "kernels (rebuild it with `make runtime` against the GPU host's torch)");
#endif
}

} // namespace fsdp_rt
