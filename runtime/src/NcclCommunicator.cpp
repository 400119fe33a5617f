//===- NcclCommunicator.cpp - the CUDA backend's collectives --------------===//

#include "fsdp_rt/NcclCommunicator.h"

#include <utility>

namespace fsdp_rt::nccl {

ncclDataType_t dataType(Wire wire) {
  switch (wire) {
  case Wire::F32: return ncclFloat32;
  case Wire::BF16: return ncclBfloat16;
  case Wire::F16: return ncclFloat16;
  case Wire::F64: return ncclFloat64;
  case Wire::I64: return ncclInt64;
  case Wire::I32: return ncclInt32;
  case Wire::U8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t reduceOp(Reduce reduce) {
  switch (reduce) {
  case Reduce::Sum: return ncclSum;
  case Reduce::Max: return ncclMax;
  case Reduce::Min: return ncclMin;
  case Reduce::Product: return ncclProd;
  }
  return ncclSum;
}

Status version(int &out) {
  ncclResult_t result = ncclGetVersion(&out);
  if (result != ncclSuccess)
    return {false, std::string("ncclGetVersion failed: ") + ncclGetErrorString(result)};
  return Status::success();
}

Status Communicator::create(int rank, int ranks, const ncclUniqueId &id, cudaStream_t stream,
                            Communicator &out) {
  if (rank < 0 || rank >= ranks)
    return {false, "nccl: rank " + std::to_string(rank) + " is outside a group of " +
                       std::to_string(ranks)};
  Communicator made;
  made.rank_ = rank;
  made.ranks_ = ranks;
  made.stream_ = stream;
  Status status = made.check(ncclCommInitRank(&made.comm_, ranks, id, rank), "ncclCommInitRank");
  if (!status.ok)
    return status;
  out = std::move(made);
  return Status::success();
}

Communicator::Communicator(Communicator &&other) noexcept { *this = std::move(other); }

Communicator &Communicator::operator=(Communicator &&other) noexcept {
  std::swap(comm_, other.comm_);
  std::swap(stream_, other.stream_);
  std::swap(rank_, other.rank_);
  std::swap(ranks_, other.ranks_);
  return *this;
}

Communicator::~Communicator() {
  if (comm_)
    ncclCommDestroy(comm_);
}

Status Communicator::check(ncclResult_t result, const char *what) const {
  if (result == ncclSuccess)
    return Status::success();
  std::string message = std::string("nccl: rank ") + std::to_string(rank_) + " of " +
                        std::to_string(ranks_) + ": " + what + " failed: " +
                        ncclGetErrorString(result);
  if (comm_) {
    const char *last = ncclGetLastError(comm_);
    if (last && *last)
      message += std::string(" (") + last + ")";
  }
  return {false, message};
}

Status Communicator::allGather(const void *send, void *recv, size_t count, Wire wire) {
  return check(ncclAllGather(send, recv, count, dataType(wire), comm_, stream_), "all_gather");
}

Status Communicator::reduceScatter(const void *send, void *recv, size_t count, Wire wire,
                                   Reduce reduce) {
  return check(ncclReduceScatter(send, recv, count, dataType(wire), reduceOp(reduce), comm_, stream_),
               "reduce_scatter");
}

Status Communicator::allReduce(const void *send, void *recv, size_t count, Wire wire, Reduce reduce) {
  return check(ncclAllReduce(send, recv, count, dataType(wire), reduceOp(reduce), comm_, stream_),
               "all_reduce");
}

Status Communicator::record(cudaEvent_t event) {
  cudaError_t error = cudaEventRecord(event, stream_);
  if (error != cudaSuccess)
    return {false, std::string("cuda: rank ") + std::to_string(rank_) +
                       ": cudaEventRecord failed: " + cudaGetErrorString(error)};
  return Status::success();
}

} // namespace fsdp_rt::nccl
