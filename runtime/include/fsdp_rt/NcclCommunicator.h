//===- NcclCommunicator.h - the CUDA backend's collectives -------*- C++ -*-===//
//
// NCCL called directly, on one CUDA stream: the collectives the executor's
// CUDA backend (runtime/src/Executor.cpp) will issue on packed flat buffers
// (packing, padding and casts stay in the executor, shared with the CPU
// backend). Failures come back as a Status naming the rank, the collective
// and NCCL's reason; nothing throws, so this builds with or without C++
// exceptions.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_NCCLCOMMUNICATOR_H
#define FSDP_RT_NCCLCOMMUNICATOR_H

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <string>

namespace fsdp_rt::nccl {

/// Success, or what went wrong and where.
struct Status {
  bool ok = true;
  std::string message;
  static Status success() { return {}; }
};

/// Element types the collectives move (the dtypes on the wire).
enum class Wire { F32, BF16, F16, F64, I64, I32, U8 };
ncclDataType_t dataType(Wire wire);

enum class Reduce { Sum, Max, Min, Product };
ncclRedOp_t reduceOp(Reduce reduce);

/// NCCL's library version, e.g. 22809 for 2.28.9 (needs no GPU).
Status version(int &out);

class Communicator {
public:
  /// Joins the group `id` as `rank` of `ranks`, issuing on `stream`.
  static Status create(int rank, int ranks, const ncclUniqueId &id, cudaStream_t stream,
                       Communicator &out);
  Communicator() = default;
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;
  Communicator(Communicator &&other) noexcept;
  Communicator &operator=(Communicator &&other) noexcept;
  ~Communicator();

  /// `count` elements per rank from `send` into `recv` (ranks x count).
  Status allGather(const void *send, void *recv, size_t count, Wire wire);
  /// `recv` (count elements) receives this rank's reduced slice of `send` (ranks x count).
  Status reduceScatter(const void *send, void *recv, size_t count, Wire wire, Reduce reduce);
  Status allReduce(const void *send, void *recv, size_t count, Wire wire, Reduce reduce);
  /// An event that completes when everything issued so far has.
  Status record(cudaEvent_t event);

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }

private:
  Status check(ncclResult_t result, const char *what) const;

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = -1;
  int ranks_ = 0;
};

} // namespace fsdp_rt::nccl

#endif // FSDP_RT_NCCLCOMMUNICATOR_H
