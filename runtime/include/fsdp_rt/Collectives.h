//===- Collectives.h - one collective interface, two backends ---*- C++ -*-===//
//
// The executor packs buffers and unpacks results; a Collectives object issues
// the collective on its process group and waits for it. Two implementations,
// chosen by the backend that the group uses for the program's device:
//
//  - Gloo (CPU tensors, and CUDA tensors of ranks that share a GPU): Gloo's
//    all-gather and reduce-scatter copy through temporaries as large as their
//    buffers, so both run as one in-place all-reduce; a wait blocks the host
//    for at most the step's timeout.
//  - NCCL through ProcessGroupNCCL (the torch wheel's NCCL, bootstrapped by
//    the job's store): the collective runs on the group's NCCL stream after
//    an event recorded on the compute stream at the start; the wait makes the
//    compute stream wait for the collective's end event and returns at once,
//    so the host runs ahead and collectives overlap the kernels issued
//    between a start and its wait. No host thread waits for it: the step
//    notes an event per wait (DeviceWaits), which fsdpc's watchdog
//    (python/fsdpc/watchdog.py) holds against the step's deadline.
//    Gathering into the results, each parameter's shard is cast straight
//    into its own place in the parameter's padded full tensor and gathered
//    in place, one all-gather per parameter coalesced into one launch: no
//    staging at all.
//
// Staging buffers are allocated on the compute stream and dropped at the
// wait, after the compute stream waits for the collective: the caching
// allocator hands their memory only to work ordered after that wait, so it is
// never reused while the collective still reads or writes it, and the program
// order is the allocation order the memory report models.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_COLLECTIVES_H
#define FSDP_RT_COLLECTIVES_H

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <c10/core/Event.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp_rt {

/// One collective between its start and its wait.
struct Pending {
  c10::intrusive_ptr<c10d::Work> work;
  /// The staging buffers the collective reads and writes.
  at::Tensor send, recv;
  /// After the wait: an all-gather's [ranks, elements] blocks, or a
  /// reduction's result (this rank's block for a reduce-scatter).
  at::Tensor result;
  /// The result is one row of `send` (reduced in place): the wait copies it
  /// out and drops the rest.
  bool rowOfSend = false;
  /// The element offset of each input in the per-rank block.
  std::vector<int64_t> offsets;
  /// An all-gather into results: each parameter's padded full tensor, flat
  /// ([ranks x its shard's elements]). A backend that gathered through
  /// `recv` copies into them at the wait.
  std::vector<at::Tensor> into;
};

/// A collective as it was handed to the backend: the c10d operation, the
/// bytes of the buffer it reduced (all_reduce), gathered into (all_gather)
/// or scattered from (reduce_scatter), and the group's size.
struct IssuedCollective {
  std::string op;
  int64_t bytes, ranks;
};

class Collectives {
public:
  /// The implementation for `group`'s backend on `device`; throws for a
  /// backend fsdpc does not drive.
  static std::unique_ptr<Collectives> forGroup(c10d::ProcessGroup &group, c10::Device device,
                                               std::chrono::milliseconds timeout);
  virtual ~Collectives() = default;

  int64_t rank() const { return group_.getRank(); }
  int64_t ranks() const { return group_.getSize(); }

  /// A buffer of `elements` for this rank's block of an all-gather, to be
  /// packed by the caller before `allGather`.
  virtual at::Tensor gatherBlock(Pending &pending, int64_t elements, const at::TensorOptions &options) = 0;
  virtual IssuedCollective allGather(Pending &pending) = 0;
  /// Where this rank's shard of each parameter is to be packed before an
  /// all-gather into `pending.into` (flat, one per parameter); by default
  /// regions of one block (`gatherBlock`).
  virtual std::vector<at::Tensor> intoBlocks(Pending &pending, int64_t elements, const at::TensorOptions &options);
  /// The all-gather into `pending.into`; by default through the receive
  /// buffer, copied into them at the wait.
  virtual IssuedCollective allGatherInto(Pending &pending);
  /// Reduces `packed` ([ranks, elements], one row per destination rank)
  /// and leaves this rank's row as the result.
  virtual IssuedCollective reduceScatter(Pending &pending, at::Tensor packed, c10d::ReduceOp op) = 0;
  /// Reduces `flat` in place; the result is `flat`.
  IssuedCollective allReduce(Pending &pending, at::Tensor flat, c10d::ReduceOp op);
  /// Orders what follows after the collective; `pending.result` is then valid.
  void wait(Pending &pending);
  /// Whether `wait` blocks the host until the collective ends (else it only
  /// orders the compute stream after it).
  virtual bool waitsOnHost() const = 0;

protected:
  virtual void waitForWork(c10d::Work &work) = 0;

  explicit Collectives(c10d::ProcessGroup &group) : group_(group) {}

  c10d::ProcessGroup &group_;
};

/// The collectives of one step whose waits left the host running (NCCL):
/// for each, an event recorded on the compute stream right after its wait,
/// complete once the collective and the kernels before it are. Another
/// thread (the watchdog) polls it while the step runs and after.
class DeviceWaits {
public:
  void add(std::string collective, std::string group, c10::Event done);
  /// The step has issued everything: no collective is added after this.
  void seal();
  bool sealed() const;
  /// The first collective whose wait has not completed, as (its
  /// description, its group's key); none once all have. A call resumes
  /// after the events an earlier call saw complete.
  std::optional<std::pair<std::string, std::string>> firstUnfinished();

private:
  struct Entry {
    std::string collective, group;
    c10::Event done;
  };
  std::vector<Entry> entries_;
  size_t finished_ = 0;
  bool sealed_ = false;
  mutable std::mutex polling_;
};

/// Drops a finished collective's staging buffer now, also where the process
/// group still holds a reference to it (until its worker lets go of the
/// work), which would keep the memory alive at a moment nobody planned.
void freeStagingNow(at::Tensor &buffer);

} // namespace fsdp_rt

#endif // FSDP_RT_COLLECTIVES_H
