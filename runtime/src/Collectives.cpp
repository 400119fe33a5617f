//===- Collectives.cpp - Gloo and NCCL behind one interface ---------------===//

#include "fsdp_rt/Collectives.h"

#include <ATen/ops/from_blob.h>

#include <stdexcept>

namespace fsdp_rt {

namespace {

class GlooCollectives final : public Collectives {
public:
  GlooCollectives(c10d::ProcessGroup &group, std::chrono::milliseconds timeout)
      : Collectives(group), timeout_(timeout) {}

  // The gathered buffer starts as negative zeros with this rank's block
  // packed in; summing in place fills in the others (x + -0 is exactly x,
  // also for +0, -0, inf and NaN).
  at::Tensor gatherBlock(Pending &pending, int64_t elements, const at::TensorOptions &options) override {
    pending.recv = at::empty({ranks(), elements}, options).fill_(-0.0);
    return pending.recv.select(0, rank());
  }

  IssuedCollective allGather(Pending &pending) override {
    pending.result = pending.recv;
    return allReduce(pending, pending.recv.view(-1), c10d::ReduceOp::SUM);
  }

  IssuedCollective reduceScatter(Pending &pending, at::Tensor packed, c10d::ReduceOp op) override {
    pending.send = packed;
    pending.result = packed.select(0, rank());
    pending.rowOfSend = true;
    return allReduce(pending, packed.view(-1), op);
  }

  void waitForWork(c10d::Work &work) override {
    if (!work.wait(timeout_))
      throw std::runtime_error("did not complete");
  }

  bool waitsOnHost() const override { return true; }

private:
  std::chrono::milliseconds timeout_;
};

class NcclCollectives final : public Collectives {
public:
  explicit NcclCollectives(c10d::ProcessGroup &group) : Collectives(group) {}

  // The all-gather runs in place: this rank's block is packed straight into
  // its row of the receive buffer (NCCL's in-place all-gather, as FSDP2
  // gathers), with no send buffer beside it. Allocated here, on the compute
  // stream: a host bucket issues its gather from the host-to-device stream,
  // whose pool the memory model does not know.
  at::Tensor gatherBlock(Pending &pending, int64_t elements, const at::TensorOptions &options) override {
    pending.recv = at::empty({ranks() * elements}, options);
    pending.send = pending.recv.narrow(0, rank() * elements, elements);
    return pending.send;
  }

  IssuedCollective allGather(Pending &pending) override {
    pending.work = group_._allgather_base(pending.recv, pending.send);
    pending.result = pending.recv.view({ranks(), pending.send.numel()});
    return {"all_gather", static_cast<int64_t>(pending.recv.nbytes()), ranks()};
  }

  // This rank's shard goes straight into its place in the padded full
  // tensor: the all-gather runs in place, with no send buffer.
  std::vector<at::Tensor> intoBlocks(Pending &pending, int64_t, const at::TensorOptions &) override {
    std::vector<at::Tensor> blocks;
    for (const at::Tensor &full : pending.into)
      blocks.push_back(full.view({ranks(), full.numel() / ranks()}).select(0, rank()));
    return blocks;
  }

  // One in-place all-gather per parameter, coalesced into one NCCL group.
  // ProcessGroupNCCL keeps a collective's tensors referenced until its
  // watchdog retires the work, past the reshard that frees them; it gets
  // aliases that do not own the memory, so the results' storage is freed
  // where the program says. That is safe: the compute stream waits for the
  // collective before anything after the wait, allocations included, runs.
  IssuedCollective allGatherInto(Pending &pending) override {
    std::vector<at::Tensor> inputs, outputs;
    int64_t bytes = 0;
    for (const at::Tensor &full : pending.into) {
      int64_t shard = full.numel() / ranks();
      // The device is given, not looked up from the pointer: no driver call
      // per parameter, and an empty parameter's null pointer is fine.
      outputs.push_back(at::for_blob(full.data_ptr(), full.sizes())
                            .options(full.options())
                            .target_device(full.device())
                            .make_tensor());
      inputs.push_back(outputs.back().narrow(0, rank() * shard, shard));
      bytes += full.nbytes();
    }
    pending.work = group_.allgather_into_tensor_coalesced(outputs, inputs);
    return {"all_gather", bytes, ranks()};
  }

  // Over one rank the one row is the whole packed buffer: it is reduced in
  // place (an all-reduce of one rank) and is the result, with no receive
  // buffer as large as the gradients beside it (the memory model's rule).
  IssuedCollective reduceScatter(Pending &pending, at::Tensor packed, c10d::ReduceOp op) override {
    pending.send = packed.view(-1);
    if (ranks() == 1)
      return {"reduce_scatter", allReduce(pending, pending.send, op).bytes, 1};
    pending.recv = at::empty({packed.size(1)}, packed.options());
    c10d::ReduceScatterOptions options;
    options.reduceOp = op;
    pending.work = group_._reduce_scatter_base(pending.recv, pending.send, options);
    pending.result = pending.recv;
    return {"reduce_scatter", static_cast<int64_t>(pending.send.nbytes()), ranks()};
  }

  // No timeout: ProcessGroupNCCL blocks the host until the collective ends
  // when given one. Without, the compute stream waits for its end event;
  // the step's DeviceWaits carry the deadline to fsdpc's watchdog.
  void waitForWork(c10d::Work &work) override { work.wait(); }

  bool waitsOnHost() const override { return false; }
};

} // namespace

IssuedCollective Collectives::allReduce(Pending &pending, at::Tensor flat, c10d::ReduceOp op) {
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  std::vector<at::Tensor> tensors{flat};
  pending.work = group_.allreduce(tensors, options);
  if (!pending.result.defined())
    pending.result = flat;
  return {"all_reduce", static_cast<int64_t>(flat.nbytes()), ranks()};
}

std::vector<at::Tensor> Collectives::intoBlocks(Pending &pending, int64_t elements,
                                                const at::TensorOptions &options) {
  at::Tensor block = gatherBlock(pending, elements, options);
  std::vector<at::Tensor> blocks;
  for (size_t i = 0; i < pending.into.size(); ++i)
    blocks.push_back(block.narrow(0, pending.offsets[i], pending.into[i].numel() / ranks()));
  return blocks;
}

IssuedCollective Collectives::allGatherInto(Pending &pending) { return allGather(pending); }

void Collectives::wait(Pending &pending) {
  waitForWork(*pending.work);
  pending.work.reset();
  if (!pending.into.empty() && pending.result.defined()) { // gathered through `recv`
    for (size_t i = 0; i < pending.into.size(); ++i) {
      int64_t elements = pending.into[i].numel() / ranks();
      pending.into[i].view({ranks(), elements}).copy_(pending.result.narrow(1, pending.offsets[i], elements));
    }
  }
  if (pending.rowOfSend) {
    pending.result = pending.result.clone();
    freeStagingNow(pending.send);
  }
}

void DeviceWaits::add(std::string collective, std::string group, c10::Event done) {
  std::lock_guard<std::mutex> lock(polling_);
  entries_.push_back({std::move(collective), std::move(group), std::move(done)});
}

void DeviceWaits::seal() {
  std::lock_guard<std::mutex> lock(polling_);
  sealed_ = true;
}

bool DeviceWaits::sealed() const {
  std::lock_guard<std::mutex> lock(polling_);
  return sealed_;
}

std::optional<std::pair<std::string, std::string>> DeviceWaits::firstUnfinished() {
  std::lock_guard<std::mutex> lock(polling_);
  while (finished_ < entries_.size() && entries_[finished_].done.query())
    ++finished_;
  if (finished_ == entries_.size())
    return std::nullopt;
  return std::make_pair(entries_[finished_].collective, entries_[finished_].group);
}

std::unique_ptr<Collectives> Collectives::forGroup(c10d::ProcessGroup &group, c10::Device device,
                                                   std::chrono::milliseconds timeout) {
  std::string name;
  try {
    name = group.getBackend(device.type())->getBackendName();
  } catch (const std::exception &) {
    throw std::runtime_error("process group '" + group.getGroupName() + "' has no backend for " +
                             c10::DeviceTypeName(device.type(), /*lower_case=*/true) +
                             " tensors (create the job's groups with gloo for cpu, nccl or gloo for cuda)");
  }
  if (name == "gloo")
    return std::make_unique<GlooCollectives>(group, timeout);
  if (name == "nccl")
    return std::make_unique<NcclCollectives>(group);
  throw std::runtime_error("process group '" + group.getGroupName() + "' uses the " + name +
                           " backend; fsdpc's runtime drives gloo and nccl");
}

void freeStagingNow(at::Tensor &buffer) {
  if (!buffer.defined())
    return;
  c10::StorageImpl *storage = buffer.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, buffer.device()));
  storage->set_nbytes(0);
  buffer = at::Tensor();
}

} // namespace fsdp_rt
