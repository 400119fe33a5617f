//===- Kernels.h - compiling and launching a program's generated kernels -*- C++ -*-===//
//
// A generated elementwise kernel (KernelSpec) arrives as the compiler laid
// it out: the element function in float and the loop's geometry as data.
// The runtime prints the loop around the element function from that data
// alone (kernelSource), so the memory a kernel touches is what the loader
// validated and each launch checks, compiles it with NVRTC for the GPU it
// runs on (the torch wheel's NVRTC; cubins cached on disk by source and
// architecture), loads it with the CUDA runtime's library API and launches
// it on the current stream. A program's kernels compile in parallel when it
// is loaded for a GPU, not at the first step.
//
// For `extents` [64, 2, 16] (innermost first), vector 8, an input with
// steps [1, 64, 2048] and one broadcast over the first two ([0, 0, 1]):
//
//   for (I i = first thread; i < 2048 / 8; i += every thread) {
//     d0 = (i % 8) * 8; d1 = (i / 8) % 2; d2 = i / 16;
//     x0[0..7] = one 16-byte load at in0 + d0 + d1 * 64 + d2 * 2048;
//     x1[0..7] = in1[d2], repeated;
//     out0[...] = the element function of (x0[v], x1[v]), one 16-byte store
//   }
//
// with the 16-byte path taken when every vector-read pointer is aligned,
// else the same loop one element at a time.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_KERNELS_H
#define FSDP_RT_KERNELS_H

#include "fsdp_rt/Program.h"

#include <ATen/core/Tensor.h>

#include <c10/core/Stream.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fsdp_rt {

/// The profiler's name for a generated kernel's launch (a `cpu_op` around
/// it, as ATen's calls have), so that a measured trace attributes the kernel.
inline constexpr const char *kKernelLaunchRecord = "fsdp::pointwise";

/// The CUDA C++ source the runtime compiles for `kernel` (a validated
/// KernelSpec): its element function inside the loop its geometry states,
/// entered as `extern "C" <name>_kernel(inputs..., outputs...)`.
std::string kernelSource(const KernelSpec &kernel);

/// `kernel` compiled by NVRTC for compute capability `arch` (90: sm_90) into
/// a cubin; throws std::runtime_error with NVRTC's log.
std::string compileKernel(const KernelSpec &kernel, int arch);

/// A program's kernels compiled for one GPU and loaded there.
class LoadedKernels {
public:
  /// Compiles `kernels` for `device`'s architecture (in parallel; with
  /// `cacheDir` non-empty, cubins are read from and written to it) and
  /// loads them. Throws std::runtime_error naming the kernel that fails.
  LoadedKernels(const std::vector<KernelSpec> &kernels, c10::Device device, const std::string &cacheDir);
  ~LoadedKernels();
  LoadedKernels(const LoadedKernels &) = delete;
  LoadedKernels &operator=(const LoadedKernels &) = delete;

  /// Runs kernel `index` over `inputs` on the current stream of the device
  /// and returns its outputs; throws std::runtime_error when an input is not
  /// the tensor the program laid the kernel out for (device, dtype, sizes,
  /// strides).
  std::vector<at::Tensor> launch(size_t index, const std::vector<at::Tensor> &inputs) const;

private:
  struct Loaded;
  void load(const KernelSpec &kernel, const std::string &cubin);
  /// Hands the libraries over to be unloaded once the streams the kernels
  /// were launched on have finished what is queued now.
  void retire();
  std::vector<KernelSpec> kernels;
  c10::Device device;
  std::vector<Loaded> loaded;
  mutable std::mutex launchedMutex;
  mutable std::vector<c10::Stream> launchedOn; // each stream a kernel was launched on
};

} // namespace fsdp_rt

#endif // FSDP_RT_KERNELS_H
