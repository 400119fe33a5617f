//===- HostStaging.h - device staging of offloaded shards -------*- C++ -*-===//
//
// The one definition of the device memory a host all-gather stages through
// on a GPU, shared by the runtime, which allocates it, and the compiler's
// memory model, which counts it. A shard held in host memory in another
// dtype than the collective's is copied to the device in its own dtype
// (casting while copying would run on the CPU) and cast there into the send
// buffer; it crosses in chunks through one staging buffer, so the device
// holds a chunk instead of a copy of every shard of the bucket (384 MiB per
// layer of the 2.6B Llama in fp32, most of its offloaded step's staging at
// the peak).
//
// Header-only, C++17, no dependencies: it must build with nvcc and the torch
// wheel alone on machines that have no MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_HOSTSTAGING_H
#define FSDP_RT_HOSTSTAGING_H

#include <algorithm>
#include <cstdint>

namespace fsdp_rt {

/// The most bytes of a shard that cross the host link at a time when the
/// shard must be cast: large enough for full-speed copies (the link reaches
/// its bandwidth from about a megabyte), small beside a unit's shards.
inline constexpr int64_t kHostCastChunkBytes = int64_t(32) << 20;

/// The staging buffer of a host all-gather whose largest shard to cast has
/// `largestCastShardBytes` (0 where it casts none): one chunk, or less.
inline int64_t hostCastStagingBytes(int64_t largestCastShardBytes) {
  return std::min(kHostCastChunkBytes, largestCastShardBytes);
}

} // namespace fsdp_rt

#endif // FSDP_RT_HOSTSTAGING_H
