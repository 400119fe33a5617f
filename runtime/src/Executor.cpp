//===- Executor.cpp - run a program's instructions ------------------------===//
//
// Collectives use FSDP's dim-0 padding layout (fsdp_rt/ShardLayout.h) and
// copy each bucket once in each direction, in one call each way (one kernel
// on a GPU): the start packs every input straight into one flat buffer (a
// gather's: this rank's row of its receive buffer, gathered in place),
// casting as it copies (`_foreach_copy_` for a gather's shards, `_chunk_cat`
// for a reduction's padded inputs); the wait splits an all-gather's result
// into its parameters (`split_with_sizes_copy`, or per parameter where one
// is padded), and a reduction's results are views of its receive buffer (a
// cast copies only when the result dtype differs). Staging buffers are
// dropped at the wait. The backend behind a group (fsdp_rt/Collectives.h)
// issues and waits; nothing here depends on it. ATen calls dispatch below
// autograd: the program is its own backward.
//
// Offloaded units (`host` collectives) on a GPU: the copy-in of a bucket of
// host shards runs on the host-to-device stream, after an event on the
// compute stream, and the collective is issued from it, so the copy overlaps
// the kernels issued after the start. A `host` reduction's wait copies the results
// to pinned host memory on the device-to-host stream; the device memory they
// came from is recorded on it, so the allocator reuses it only after the
// copy. Two streams because the host link is full duplex (a copy engine
// each way): the next unit's shards come in while the last one's gradients
// go out. The step ends by waiting for both: the host then owns the
// gradients and may update the shards. On a CPU program host memory is
// the device's, and these collectives run as any other. A host update still
// running on a unit's shards (the optimizer overlapped with this step) is
// waited for right before its gather reads them.
//
//===----------------------------------------------------------------------===//

#include "fsdp_rt/Executor.h"
#include "fsdp_rt/HostStaging.h"
#include "fsdp_rt/Kernels.h"
#include "fsdp_rt/ShardLayout.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/_chunk_cat.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/split_with_sizes_copy.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace fsdp_rt {

namespace {

/// Which way a copy crosses the host link.
enum class Transfer { ToDevice, ToHost };

/// The device's stream for copies one way, the same for every step: the
/// caching allocator keeps a pool per stream, so a stream per step would
/// strand the memory freed on each. High-priority ones, as FSDP2's copy
/// streams (and never one of ProcessGroupNCCL's, which come from the other
/// pool), both taken at once so that the pool's round robin makes them two.
c10::Stream transferStream(c10::Device device, Transfer way) {
  static std::mutex choosing;
  static std::map<c10::DeviceIndex, std::pair<c10::Stream, c10::Stream>> streams; // to the device, to the host
  std::lock_guard<std::mutex> lock(choosing);
  auto found = streams.find(device.index());
  if (found == streams.end()) {
    c10::impl::VirtualGuardImpl guard(device.type());
    c10::Stream toDevice = guard.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
    c10::Stream toHost = guard.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
    found = streams.emplace(device.index(), std::make_pair(toDevice, toHost)).first;
  }
  return way == Transfer::ToDevice ? found->second.first : found->second.second;
}

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string shapeText(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

int64_t shardRowsOf(int64_t dim0, int64_t ranks) {
  auto layout = Dim0ShardLayout::create(dim0, ranks);
  if (!layout)
    throw std::runtime_error("cannot shard " + std::to_string(dim0) + " rows over " +
                             std::to_string(ranks) + " ranks");
  return layout->shardRows();
}

c10d::ReduceOp toReduceOp(Reduction reduction) {
  switch (reduction) {
  case Reduction::Max: return c10d::ReduceOp::MAX;
  case Reduction::Min: return c10d::ReduceOp::MIN;
  case Reduction::Product: return c10d::ReduceOp::PRODUCT;
  case Reduction::Sum:
  case Reduction::Average: // summed, then divided: every backend has SUM
    return c10d::ReduceOp::SUM;
  }
  return c10d::ReduceOp::SUM;
}

/// A collective between its start and its wait.
struct InFlight {
  const Instruction *inst = nullptr;
  Collectives *backend = nullptr;
  Pending collective;
  /// A host bucket's inputs, and the staging buffer of the shards it casts:
  /// the host-to-device stream reads them until the collective has run.
  std::vector<at::Tensor> held;
  int64_t ranks = 1, total = 0, startUs = 0;
  bool started = false;
};

class Executor {
public:
  Executor(const Program &program, const Function &function, StepInputs inputs)
      : device(program.device()), kernels(program.loadedKernels()), bufferSpecs(program.buffers()),
        function(function), in(std::move(inputs)),
        slots(function.slots), futures(function.futures) {
    std::set<std::string> offloadedUnits;
    for (const ParamSpec &param : program.params())
      if (param.offloaded) {
        offloaded.insert(param.name);
        offloadedUnits.insert(param.unit);
      }
    for (const auto &[unit, update] : in.hostUpdates)
      if (!update || !offloadedUnits.count(unit))
        throw std::runtime_error("fsdp_rt: a host update for unit @" + unit +
                                 (update ? ", which the program does not offload" : " is null"));
  }

  StepOutputs run() {
    c10::DeviceGuard onDevice(device); // the stream and allocator of the program's device
    // The program is its own backward and no value in it requires grad, so
    // autograd's kernels (view tracking, version counters) are skipped.
    at::AutoDispatchBelowADInplaceOrView belowAutograd;
    // Every call's dtypes are the program's: a caller's torch.autocast must
    // not cast its inputs again.
    c10::impl::ExcludeDispatchKeyGuard noAutocast(c10::autocast_dispatch_keyset);
    checkInputs();
    for (size_t i = 0; i < function.inputs.size(); ++i)
      slots[function.inputs[i]] = in.batch[i].contiguous(); // row-major, as the compiler laid out its reads
    for (size_t index = 0; index < function.instructions.size(); ++index) {
      const Instruction &inst = function.instructions[index];
      int64_t start = in.trace ? nowUs() : 0;
      try {
        step(inst);
      } catch (const std::exception &error) {
        computeAfterTransfers();
        throw std::runtime_error("fsdp_rt: rank " + rankText() + ": @" + function.name +
                                 " instruction " + std::to_string(index) + " (" + describe(inst) +
                                 (inst.where.empty() ? "" : " at " + inst.where) + "): " + error.what());
      }
      if (in.trace)
        record(inst, start);
    }
    for (InFlight &pending : futures)
      if (pending.started) {
        computeAfterTransfers();
        throw std::runtime_error("fsdp_rt: rank " + rankText() + ": " + describe(*pending.inst) +
                                 " was never waited for");
      }
    // The host optimizer reads the gradients, and writes the shards.
    if (toDevice)
      toDevice->synchronize();
    if (toHost)
      toHost->synchronize();
    return std::move(out);
  }

private:
  std::string rankText() const {
    for (auto &[key, group] : in.groups)
      if (group)
        return std::to_string(group->getRank());
    return "0";
  }

  /// The instruction's name, with its group and unit where it has them.
  std::string describe(const Instruction &inst) const {
    return inst.name + (inst.group.empty() ? "" : " on group '" + inst.group + "'") +
           (inst.unit.empty() ? "" : " (unit @" + inst.unit + ")");
  }

  void checkInputs() {
    auto checkDevice = [&](const std::map<std::string, at::Tensor> &table, const char *what) {
      for (const auto &[name, value] : table) {
        // An offloaded shard lives in host memory (the device's own on a CPU program).
        c10::Device expected = &table == &in.params && offloaded.count(name) ? c10::Device(c10::kCPU) : device;
        if (value.defined() && value.device() != expected)
          throw std::runtime_error("fsdp_rt: " + std::string(what) + " '" + name + "' is on " + value.device().str() +
                                   "; the program " +
                                   (expected == device ? "runs on " + device.str() : std::string("offloads it to cpu")));
      }
    };
    checkDevice(in.params, "parameter");
    checkDevice(in.buffers, "buffer");
    for (const BufferSpec &spec : bufferSpecs) {
      auto given = in.buffers.find(spec.name);
      if (given == in.buffers.end() || !given->second.defined())
        continue; // reading it names it missing
      const at::Tensor &buffer = given->second;
      if (buffer.sizes() != at::IntArrayRef(spec.shape) || buffer.scalar_type() != scalarTypeOf(spec.dtype))
        throw std::runtime_error("fsdp_rt: buffer '" + spec.name + "' is " + shapeText(buffer.sizes()) + " " +
                                 c10::toString(buffer.scalar_type()) + "; the step was compiled for " +
                                 shapeText(spec.shape) + " " + spec.dtype);
    }
    checkDevice(in.accumulated, "accumulated gradient");
    if (in.batch.size() != function.inputTypes.size())
      throw std::runtime_error("fsdp_rt: @" + function.name + " takes " +
                               std::to_string(function.inputTypes.size()) + " batch tensors, got " +
                               std::to_string(in.batch.size()));
    for (size_t i = 0; i < in.batch.size(); ++i) {
      const TensorSpec &spec = function.inputTypes[i];
      const at::Tensor &given = in.batch[i];
      if (given.defined() && given.device() != device)
        throw std::runtime_error("fsdp_rt: batch tensor " + std::to_string(i) + " of @" + function.name + " is on " +
                                 given.device().str() + "; the program runs on " + device.str());
      if (!given.defined() || given.sizes() != at::IntArrayRef(spec.shape) ||
          given.scalar_type() != spec.dtype)
        throw std::runtime_error(
            "fsdp_rt: batch tensor " + std::to_string(i) + " of @" + function.name + " is " +
            (given.defined() ? shapeText(given.sizes()) + " " + std::string(c10::toString(given.scalar_type()))
                             : std::string("undefined")) +
            "; the step was compiled for " + shapeText(spec.shape) + " " + c10::toString(spec.dtype));
    }
  }

  const at::Tensor &tensor(int slot) {
    const c10::IValue &value = slots.at(slot);
    if (!value.isTensor())
      throw std::runtime_error("slot " + std::to_string(slot) +
                               " holds no tensor (used after its release?)");
    return value.toTensor();
  }

  static at::Tensor lookup(const std::map<std::string, at::Tensor> &table, const std::string &name,
                           const char *what) {
    auto it = table.find(name);
    if (it == table.end())
      throw std::runtime_error(std::string("the step reads ") + what + " '" + name +
                               "', which the driver did not pass");
    return it->second;
  }

  c10d::ProcessGroup &group(const std::string &key) {
    auto it = in.groups.find(key);
    if (it == in.groups.end() || !it->second)
      throw std::runtime_error("no process group for '" + key + "'");
    return *it->second;
  }

  Collectives &collectives(const std::string &key) {
    std::unique_ptr<Collectives> &backend = backends[key];
    if (!backend)
      backend = Collectives::forGroup(group(key), device, in.timeout);
    return *backend;
  }

  void step(const Instruction &inst) {
    using Kind = Instruction::Kind;
    switch (inst.kind) {
    case Kind::Param: slots[inst.results[0]] = lookup(in.params, inst.name, "parameter"); return;
    case Kind::Buffer: // row-major, as the compiler laid out its reads (a buffer may be a view)
      slots[inst.results[0]] = lookup(in.buffers, inst.name, "buffer").contiguous();
      return;
    case Kind::AccumulatedGrad:
      slots[inst.results[0]] = lookup(in.accumulated, inst.name, "accumulated gradient");
      return;
    case Kind::Aten: return callAten(inst);
    case Kind::Cast: slots[inst.results[0]] = tensor(inst.inputs[0]).to(inst.dtypes[0]); return;
    case Kind::Loss: out.loss = tensor(inst.inputs[0]); return;
    case Kind::Gradients:
      for (size_t i = 0; i < inst.inputs.size(); ++i)
        out.grads[inst.params[i]] = tensor(inst.inputs[i]);
      return;
    case Kind::AllGather: return startAllGather(inst);
    case Kind::ReduceScatter:
    case Kind::AllReduce: return startReduction(inst);
    case Kind::Wait: return wait(inst);
    case Kind::Release:
      for (int slot : inst.inputs)
        slots[slot] = c10::IValue();
      return;
    case Kind::Reshard: return reshard(inst);
    case Kind::AllSlice: return allSlice(inst);
    case Kind::Pointwise: return launchPointwise(inst);
    case Kind::Return:
      for (int slot : inst.inputs)
        out.returned.push_back(tensor(slot));
      return;
    }
  }

  void callAten(const Instruction &inst) {
    stack.clear();
    for (const AtenArgument &arg : inst.args) {
      switch (arg.kind) {
      case AtenArgument::Kind::Constant: stack.push_back(arg.constant); break;
      case AtenArgument::Kind::Tensor: stack.push_back(tensor(arg.slots[0])); break;
      case AtenArgument::Kind::TensorList: {
        c10::List<at::Tensor> list;
        for (int slot : arg.slots) list.push_back(tensor(slot));
        stack.emplace_back(std::move(list));
        break;
      }
      case AtenArgument::Kind::OptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        for (int slot : arg.slots)
          list.push_back(slot < 0 ? std::optional<at::Tensor>() : std::optional<at::Tensor>(tensor(slot)));
        stack.emplace_back(std::move(list));
        break;
      }
      }
    }
    inst.op->callBoxed(&stack);
    // A `Tensor[]` result (split, unbind) is captured as one result per tensor.
    size_t next = 0;
    auto assign = [&](c10::IValue value) {
      if (next >= inst.results.size())
        throw std::runtime_error("the operator returned more results than the program expects");
      int slot = inst.results[next++];
      if (slot >= 0)
        slots[slot] = std::move(value);
    };
    for (c10::IValue &value : stack) {
      if (value.isTensorList())
        for (const at::Tensor &item : value.toTensorVector()) assign(item);
      else
        assign(std::move(value));
    }
    stack.clear(); // results the program drops die here, as it planned
    if (next != inst.results.size())
      throw std::runtime_error("the operator returned " + std::to_string(next) + " results, the program expects " +
                               std::to_string(inst.results.size()));
  }

  void launchPointwise(const Instruction &inst) {
    std::vector<at::Tensor> inputs;
    for (int slot : inst.inputs)
      inputs.push_back(tensor(slot));
    if (!kernels)
      throw std::runtime_error("the program calls generated kernels and was loaded without a GPU");
    std::vector<at::Tensor> outputs = kernels->launch(static_cast<size_t>(inst.kernel), inputs);
    for (size_t i = 0; i < outputs.size(); ++i)
      slots[inst.results[i]] = std::move(outputs[i]);
  }

  void startAllGather(const Instruction &inst) {
    if (inst.host)
      if (auto update = in.hostUpdates.find(inst.unit); update != in.hostUpdates.end())
        update->second->wait(in.timeout, inst.unit);
    Collectives &backend = collectives(inst.group);
    InFlight pending{&inst, &backend};
    pending.ranks = backend.ranks();
    std::vector<at::Tensor> shards;
    for (size_t i = 0; i < inst.inputs.size(); ++i) {
      const at::Tensor &shard = tensor(inst.inputs[i]);
      int64_t rows = shardRowsOf(inst.shapes[i].at(0), pending.ranks);
      std::vector<int64_t> expected = inst.shapes[i];
      expected[0] = rows;
      if (shard.sizes() != at::IntArrayRef(expected))
        throw std::runtime_error("input " + std::to_string(i) + " has shape " + shapeText(shard.sizes()) +
                                 ", expected the shard " + shapeText(expected));
      pending.collective.offsets.push_back(pending.total);
      pending.total += shard.numel();
      shards.push_back(shard);
    }
    at::TensorOptions options = at::TensorOptions().device(device).dtype(inst.dtypes.front());
    if (inst.intoResults) {
      startGatherIntoResults(inst, std::move(pending), shards, options);
      return;
    }
    at::Tensor mine = backend.gatherBlock(pending.collective, pending.total, options);
    auto region = [&](size_t i) {
      return mine.narrow(0, pending.collective.offsets[i], shards[i].numel()).view(shards[i].sizes());
    };
    if (inst.host && device.type() != c10::kCPU) {
      copyInFromHost(inst, pending, shards, region);
      return;
    }
    std::vector<at::Tensor> regions;
    for (size_t i = 0; i < shards.size(); ++i)
      regions.push_back(region(i));
    at::_foreach_copy_(regions, shards); // the one copy in, cast included: one kernel on a GPU
    out.collectives.push_back(backend.allGather(pending.collective));
    launch(inst, std::move(pending));
  }

  /// An all-gather into its results: each parameter's padded full tensor is
  /// allocated here, this rank's shards are cast to where the backend wants
  /// them (their own places, on NCCL), and the backend fills in the rest.
  void startGatherIntoResults(const Instruction &inst, InFlight pending, const std::vector<at::Tensor> &shards,
                              const at::TensorOptions &options) {
    Pending &collective = pending.collective;
    for (const at::Tensor &shard : shards)
      collective.into.push_back(at::empty({pending.ranks * shard.numel()}, options));
    std::vector<at::Tensor> blocks = pending.backend->intoBlocks(collective, pending.total, options);
    for (size_t i = 0; i < shards.size(); ++i)
      blocks[i] = blocks[i].view(shards[i].sizes());
    at::_foreach_copy_(blocks, shards); // one kernel on a GPU, cast included
    out.collectives.push_back(pending.backend->allGatherInto(collective));
    launch(inst, std::move(pending));
  }

  /// A failed step frees, as it unwinds, staging that a transfer stream may
  /// still write (a host gather started and not waited for). Its memory goes
  /// back to the compute stream, so that stream waits for the transfers
  /// first; the host does not (a hung collective ahead of them would hold
  /// it until the watchdog's deadline).
  void computeAfterTransfers() noexcept {
    try {
      c10::impl::VirtualGuardImpl guard(device.type());
      for (std::optional<c10::Stream> *stream : {&toDevice, &toHost})
        if (*stream) {
          c10::Event transferred(device.type());
          transferred.record(**stream);
          transferred.block(guard.getStream(device));
        }
    } catch (const std::exception &) { // a device in an error state: the step's own error says more
    }
  }

  /// The stream for copies `way`, after the compute stream's work so far.
  c10::Stream &transferAfterCompute(Transfer way) {
    c10::impl::VirtualGuardImpl guard(device.type());
    std::optional<c10::Stream> &stream = way == Transfer::ToDevice ? toDevice : toHost;
    if (!stream)
      stream = transferStream(device, way);
    c10::Event computed(device.type());
    computed.record(guard.getStream(device));
    computed.block(*stream);
    return *stream;
  }

  /// A host bucket's copy-in and collective, on the host-to-device stream.
  /// The buffers it writes were allocated on the compute stream before the
  /// event, so their memory is free of earlier work. A shard to cast crosses
  /// in chunks through one staging buffer (fsdp_rt/HostStaging.h), allocated
  /// there too and held to the wait; each chunk is cast into this rank's
  /// block before the next overwrites it (one stream orders them).
  template <typename Region>
  void copyInFromHost(const Instruction &inst, InFlight &pending, const std::vector<at::Tensor> &shards,
                      Region region) {
    at::ScalarType wire = inst.dtypes.front();
    int64_t largestCast = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      if (shards[i].device().type() != c10::kCPU)
        throw std::runtime_error("input " + std::to_string(i) + " of a host all-gather is on " +
                                 shards[i].device().str() + ", not in host memory");
      if (shards[i].scalar_type() == wire)
        continue;
      if (!shards[i].is_contiguous())
        throw std::runtime_error("input " + std::to_string(i) + " of a host all-gather is not contiguous: it "
                                 "crosses to the device in chunks of its elements in order");
      largestCast = std::max<int64_t>(largestCast, shards[i].nbytes());
    }
    pending.held = shards;
    at::Tensor staging;
    if (largestCast) {
      staging = at::empty({hostCastStagingBytes(largestCast)}, at::TensorOptions().device(device).dtype(at::kByte));
      pending.held.push_back(staging);
    }
    c10::StreamGuard onTransfer(transferAfterCompute(Transfer::ToDevice));
    for (size_t i = 0; i < shards.size(); ++i) {
      at::Tensor target = region(i);
      if (shards[i].scalar_type() == wire) {
        target.copy_(shards[i], /*non_blocking=*/true);
        continue;
      }
      at::Tensor from = shards[i].view(-1), into = target.view(-1);
      int64_t itemBytes = static_cast<int64_t>(shards[i].element_size()), chunk = kHostCastChunkBytes / itemBytes;
      for (int64_t offset = 0; offset < from.numel(); offset += chunk) {
        int64_t count = std::min(chunk, from.numel() - offset);
        at::Tensor staged = staging.narrow(0, 0, count * itemBytes).view(shards[i].scalar_type());
        staged.copy_(from.narrow(0, offset, count), /*non_blocking=*/true);
        into.narrow(0, offset, count).copy_(staged); // the cast, on the device
      }
    }
    out.collectives.push_back(pending.backend->allGather(pending.collective));
    launch(inst, std::move(pending));
  }

  void startReduction(const Instruction &inst) {
    bool scatter = inst.kind == Instruction::Kind::ReduceScatter;
    Collectives &backend = collectives(inst.group);
    InFlight pending{&inst, &backend};
    pending.ranks = backend.ranks();
    for (const std::vector<int64_t> &shape : inst.shapes) {
      pending.collective.offsets.push_back(pending.total);
      pending.total += c10::multiply_integers(shape);
    }
    const at::Tensor &first = tensor(inst.inputs.front());
    at::TensorOptions options = first.options().dtype(inst.reduceType);
    int64_t ranks = scatter ? pending.ranks : 1;
    at::Tensor packed = at::empty({ranks, pending.total}, options);
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < inst.inputs.size(); ++i) {
      const at::Tensor &input = tensor(inst.inputs[i]);
      checkPackable(input, inst.shapes[i], ranks, scatter, i);
      inputs.push_back(input);
    }
    bool oneDtype = std::all_of(inputs.begin(), inputs.end(),
                                [&](const at::Tensor &t) { return t.scalar_type() == inputs[0].scalar_type(); });
    bool chunkable = std::all_of(inputs.begin(), inputs.end(), [](const at::Tensor &t) { return t.numel() > 0 && t.dim() > 0; });
    if (oneDtype && chunkable) {
      // Each input padded to whole rows per rank and laid out rank-major,
      // cast as it is copied: one kernel on a GPU.
      at::_chunk_cat_out(packed, inputs, /*dim=*/0, /*num_chunks=*/ranks);
    } else {
      for (size_t i = 0; i < inputs.size(); ++i)
        packPadded(inputs[i], inst.shapes[i],
                   packed.narrow(1, pending.collective.offsets[i], c10::multiply_integers(inst.shapes[i])));
    }
    if (inst.preDivide != 1.0)
      packed.div_(inst.preDivide);
    c10d::ReduceOp op = toReduceOp(inst.reduction);
    out.collectives.push_back(scatter ? backend.reduceScatter(pending.collective, packed, op)
                                      : backend.allReduce(pending.collective, packed.view(-1), op));
    launch(inst, std::move(pending));
  }

  /// An input of a reduction: a reduce-scatter's must shard into `shardShape`
  /// over `ranks`, an all-reduce's must have the shape itself.
  static void checkPackable(const at::Tensor &input, const std::vector<int64_t> &shape, int64_t ranks, bool scatter,
                            size_t index) {
    if (!scatter) {
      if (input.sizes() != at::IntArrayRef(shape))
        throw std::runtime_error("input " + std::to_string(index) + " has shape " + shapeText(input.sizes()) +
                                 ", expected " + shapeText(shape));
      return;
    }
    std::vector<int64_t> rest(shape.begin() + 1, shape.end());
    if (input.dim() != static_cast<int64_t>(shape.size()) || input.sizes().slice(1) != at::IntArrayRef(rest) ||
        shardRowsOf(input.size(0), ranks) != shape.at(0))
      throw std::runtime_error("input " + std::to_string(index) + " of shape " + shapeText(input.sizes()) +
                               " does not shard into " + shapeText(shape));
  }

  /// Copies one input into `region` ([ranks, shard elements], one row per
  /// destination rank) in FSDP's padded layout: whole shards in one strided
  /// copy, then the partial shard, then zeros for the padding. An
  /// all-reduce's region is one row holding the whole input.
  static void packPadded(const at::Tensor &full, const std::vector<int64_t> &shardShape, const at::Tensor &region) {
    int64_t ranks = region.size(0);
    if (ranks == 1 || full.dim() == 0) {
      region.view(full.sizes()).copy_(full);
      return;
    }
    int64_t rows = shardShape.at(0);
    std::vector<int64_t> rest(shardShape.begin() + 1, shardShape.end());
    int64_t dim0 = full.size(0);
    int64_t whole = rows == 0 ? 0 : std::min(dim0 / rows, ranks);
    std::vector<int64_t> blocks{whole, rows};
    blocks.insert(blocks.end(), rest.begin(), rest.end());
    if (whole > 0)
      region.narrow(0, 0, whole).view(blocks).copy_(full.narrow(0, 0, whole * rows).view(blocks));
    int64_t partial = dim0 - whole * rows, rowElements = c10::multiply_integers(rest);
    int64_t firstEmpty = whole;
    if (partial > 0) {
      at::Tensor block = region.select(0, whole);
      std::vector<int64_t> partialShape{partial};
      partialShape.insert(partialShape.end(), rest.begin(), rest.end());
      block.narrow(0, 0, partial * rowElements).view(partialShape).copy_(full.narrow(0, whole * rows, partial));
      block.narrow(0, partial * rowElements, (rows - partial) * rowElements).zero_();
      ++firstEmpty;
    }
    if (firstEmpty < ranks)
      region.narrow(0, firstEmpty, ranks - firstEmpty).zero_();
  }

  void launch(const Instruction &inst, InFlight pending) {
    InFlight &entry = futures.at(inst.future);
    if (entry.started)
      throw std::runtime_error("future " + std::to_string(inst.future) + " is started twice");
    pending.started = true;
    pending.startUs = in.trace ? nowUs() : 0;
    entry = std::move(pending);
  }

  void wait(const Instruction &inst) {
    InFlight pending = std::move(futures.at(inst.future));
    futures[inst.future] = InFlight();
    if (!pending.started)
      throw std::runtime_error("future " + std::to_string(inst.future) + " was not started or is waited twice");
    const Instruction &start = *pending.inst;
    int64_t blockedFrom = in.trace ? nowUs() : 0;
    try {
      pending.backend->wait(pending.collective);
    } catch (const std::exception &error) {
      throw std::runtime_error(describe(start) + " failed or timed out after " +
                               std::to_string(in.timeout.count()) + " ms: " + error.what());
    }
    if (!pending.backend->waitsOnHost() && in.deviceWaits)
      noteDeviceWait(start);
    int64_t arrived = in.trace ? nowUs() : 0;
    if (inst.results.size() != start.shapes.size())
      throw std::runtime_error("the wait takes " + std::to_string(inst.results.size()) +
                               " results from a collective with " + std::to_string(start.shapes.size()));
    if (start.kind == Instruction::Kind::AllGather)
      copyOutGathered(start, pending, inst.results);
    else
      takeReduced(start, pending, inst);
    pending.held.clear(); // the compute stream now runs after the collective and its copy-in
    if (in.trace) {
      // Blocked time is exposed communication; the copy-out is compute.
      out.trace.push_back({describe(start), "collective", "", pending.startUs, arrived - pending.startUs});
      out.trace.push_back({"wait " + describe(start), "wait", "", blockedFrom, arrived - blockedFrom});
      out.trace.push_back({"copy-out " + describe(start), "copy-out", "", arrived, nowUs() - arrived});
    }
  }

  // The host went on without the collective: an event after its wait on
  // the compute stream tells the watchdog when it is done.
  void noteDeviceWait(const Instruction &start) {
    c10::Event done(device.type());
    done.record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
    in.deviceWaits->add(describe(start), start.group, std::move(done));
  }

  /// Copies each parameter out of the gathered buffer (rank-major blocks of
  /// the packed shards) into its own unpadded tensor, allocated in program
  /// order: where every parameter is its ranks' shards back to back, one
  /// split copy (one kernel on a GPU); otherwise per parameter, whole shards
  /// in one strided copy, then the partial one.
  void copyOutGathered(const Instruction &start, InFlight &pending, const std::vector<int> &results) {
    int64_t ranks = pending.ranks;
    if (start.intoResults) { // each result is the first rows of its padded full tensor
      for (size_t i = 0; i < start.shapes.size(); ++i) {
        std::vector<int64_t> padded = start.shapes[i];
        padded[0] = shardRowsOf(padded[0], ranks) * ranks;
        if (results[i] >= 0)
          slots[results[i]] = pending.collective.into[i].view(padded).narrow(0, 0, start.shapes[i][0]);
      }
      pending.collective.into.clear();
      dropStaging(pending.collective);
      return;
    }
    at::Tensor byRank = pending.collective.result;
    bool evenlySharded = std::all_of(start.shapes.begin(), start.shapes.end(), [&](const std::vector<int64_t> &shape) {
      return shardRowsOf(shape[0], ranks) * ranks == shape[0];
    });
    std::vector<at::Tensor> fulls;
    for (const std::vector<int64_t> &shape : start.shapes)
      fulls.push_back(at::empty(shape, byRank.options()));
    if (evenlySharded) {
      std::vector<at::Tensor> blocks;
      std::vector<int64_t> perRank;
      for (const at::Tensor &full : fulls) {
        perRank.push_back(full.numel() / ranks);
        blocks.push_back(full.view({ranks, perRank.back()}));
      }
      at::split_with_sizes_copy_out(blocks, byRank, perRank, /*dim=*/1);
    } else {
      for (size_t i = 0; i < fulls.size(); ++i) {
        const std::vector<int64_t> &shape = start.shapes[i];
        int64_t shardElements = shardRowsOf(shape[0], ranks) * c10::multiply_integers(shape.begin() + 1, shape.end());
        unpackPadded(byRank.narrow(1, pending.collective.offsets[i], shardElements), fulls[i]);
      }
    }
    for (size_t i = 0; i < fulls.size(); ++i)
      if (results[i] >= 0)
        slots[results[i]] = std::move(fulls[i]);
    byRank = at::Tensor();
    dropStaging(pending.collective);
  }

  static void dropStaging(Pending &collective) {
    collective.result = at::Tensor();
    freeStagingNow(collective.recv);
    freeStagingNow(collective.send);
  }

  /// `full` from its ranks' padded shards (`blocks`: [ranks, shard
  /// elements]): whole shards in one strided copy, then the partial one.
  static void unpackPadded(const at::Tensor &blocks, const at::Tensor &full) {
    int64_t ranks = blocks.size(0), dim0 = full.size(0), rows = shardRowsOf(dim0, ranks);
    int64_t rowElements = blocks.size(1) / std::max<int64_t>(rows, 1);
    int64_t whole = rows == 0 ? 0 : std::min(dim0 / rows, ranks);
    if (whole > 0)
      full.narrow(0, 0, whole * rows).view({whole, rows * rowElements}).copy_(blocks.narrow(0, 0, whole));
    int64_t partial = dim0 - whole * rows;
    if (partial > 0)
      full.narrow(0, whole * rows, partial)
          .view({partial * rowElements})
          .copy_(blocks.select(0, whole).narrow(0, 0, partial * rowElements));
  }

  void takeReduced(const Instruction &start, InFlight &pending, const Instruction &wait) {
    const std::vector<int> &results = wait.results;
    at::Tensor &reduced = pending.collective.result;
    double divide = start.postDivide * (start.reduction == Reduction::Average ? pending.ranks : 1);
    if (divide != 1.0)
      reduced.div_(divide);
    std::vector<at::Tensor> values;
    for (size_t i = 0; i < start.shapes.size(); ++i) {
      at::Tensor value = reduced.narrow(0, pending.collective.offsets[i], c10::multiply_integers(start.shapes[i]))
                             .view(start.shapes[i]);
      if (start.dtypes[i] != start.reduceType)
        value = value.to(start.dtypes[i]);
      values.push_back(std::move(value));
    }
    if (start.host && device.type() != c10::kCPU)
      values = copyToHost(values);
    if (start.host && in.landings)
      land(wait, values);
    for (size_t i = 0; i < values.size(); ++i)
      if (results[i] >= 0)
        slots[results[i]] = std::move(values[i]);
  }

  /// Hands a host reduction's gradients to the host optimizer stepping in
  /// backward, with an event after their copies to host memory.
  void land(const Instruction &wait, const std::vector<at::Tensor> &values) {
    std::vector<std::string> params;
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < wait.params.size(); ++i)
      if (!wait.params[i].empty()) {
        params.push_back(wait.params[i]);
        grads.push_back(values[i]);
      }
    std::shared_ptr<c10::Event> copied;
    if (device.type() != c10::kCPU) {
      copied = std::make_shared<c10::Event>(device.type());
      copied->record(*toHost);
    }
    in.landings->land(params, grads, std::move(copied));
  }

  /// Copies device results to host memory (pinned unless the caller says
  /// otherwise) on the device-to-host stream; their device memory is
  /// recorded on it, so it is reused only after the copy. run() waits for
  /// the stream before the step returns.
  std::vector<at::Tensor> copyToHost(const std::vector<at::Tensor> &values) {
    c10::Stream &stream = transferAfterCompute(Transfer::ToHost);
    c10::impl::VirtualGuardImpl guard(device.type());
    std::vector<at::Tensor> onHost;
    for (const at::Tensor &value : values) {
      at::Tensor host = at::empty(value.sizes(), value.options().device(c10::kCPU).pinned_memory(in.pinHostResults));
      {
        c10::StreamGuard onTransfer(stream);
        host.copy_(value, /*non_blocking=*/true);
      }
      guard.recordDataPtrOnStream(value.storage().data_ptr(), stream);
      onHost.push_back(std::move(host));
    }
    return onHost;
  }

  void reshard(const Instruction &inst) {
    for (int slot : inst.inputs) {
      if (!in.checkReshardFrees) {
        slots[slot] = c10::IValue();
        continue;
      }
      c10::weak_intrusive_ptr<c10::StorageImpl> storage = tensor(slot).storage().getWeakStorageImpl();
      slots[slot] = c10::IValue();
      if (!storage.expired())
        out.reshardLeaks.push_back("slot " + std::to_string(slot) + " (" + std::to_string(storage.use_count()) +
                                   " references left)");
    }
  }

  void allSlice(const Instruction &inst) {
    c10d::ProcessGroup &pg = group(inst.group);
    const at::Tensor &full = tensor(inst.inputs[0]);
    auto layout = Dim0ShardLayout::create(full.size(0), pg.getSize());
    if (!layout || layout->shardRows() != inst.rows)
      throw std::runtime_error("a tensor of " + std::to_string(full.size(0)) + " rows does not shard into " +
                               std::to_string(inst.rows) + " rows over " + std::to_string(pg.getSize()) + " ranks");
    std::vector<int64_t> shape(full.sizes().begin(), full.sizes().end());
    shape[0] = inst.rows;
    at::Tensor shard = at::empty(shape, full.options());
    int64_t real = layout->realRows(pg.getRank());
    shard.narrow(0, 0, real).copy_(full.narrow(0, layout->rowBegin(pg.getRank()), real));
    shard.narrow(0, real, inst.rows - real).zero_();
    slots[inst.results[0]] = std::move(shard);
  }

  void record(const Instruction &inst, int64_t start) {
    using Kind = Instruction::Kind;
    switch (inst.kind) {
    case Kind::Aten:
    case Kind::Pointwise:
    case Kind::Cast:
    case Kind::AllSlice:
      out.trace.push_back({inst.name, "compute", inst.where, start, nowUs() - start});
      return;
    case Kind::AllGather:
    case Kind::ReduceScatter:
    case Kind::AllReduce:
      out.trace.push_back({"start " + describe(inst), "copy-in", "", start, nowUs() - start});
      return;
    default: // waits record themselves: blocked time, then the copy-out
      return;
    }
  }

  c10::Device device;
  const LoadedKernels *kernels;
  const std::vector<BufferSpec> &bufferSpecs;
  const Function &function;
  StepInputs in;
  std::set<std::string> offloaded;      // parameters whose shards are in host memory
  std::optional<c10::Stream> toDevice, toHost; // host link copies each way, once a host collective ran
  std::map<std::string, std::unique_ptr<Collectives>> backends;
  std::vector<c10::IValue> slots;
  torch::jit::Stack stack; // an ATen call's arguments, then its results
  std::vector<InFlight> futures;
  StepOutputs out;
};

/// Whether `event` completes by `deadline`, polled with sleeps: the
/// runtime's events are made without blocking sync, so `synchronize` would
/// spin a core that the host optimizer's own threads need, and would never
/// return behind a hung transfer.
bool completesBy(const c10::Event &event, std::chrono::steady_clock::time_point deadline) {
  auto pause = std::chrono::microseconds(20);
  while (!event.query()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
  return true;
}

} // namespace

void HostUpdate::finish() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  changed.notify_all();
}

void HostUpdate::fail(std::string why) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    failure = std::move(why);
  }
  changed.notify_all();
}

void HostUpdate::wait(std::chrono::milliseconds timeout, const std::string &unit) const {
  std::unique_lock<std::mutex> lock(mutex);
  if (!changed.wait_for(lock, timeout, [&] { return done; })) {
    std::ostringstream message;
    message << "the host update of unit @" << unit << "'s shards (its optimizer step) did not finish within "
            << timeout.count() / 1000.0 << " s";
    throw std::runtime_error(message.str());
  }
  if (failure)
    throw std::runtime_error("the host update of unit @" + unit + "'s shards failed: " + *failure);
}

GradientLandings::GradientLandings(std::vector<std::pair<std::string, std::vector<std::string>>> order) {
  for (auto &[name, params] : order)
    units.push_back({std::move(name), std::move(params)});
}

void GradientLandings::land(const std::vector<std::string> &params, const std::vector<at::Tensor> &grads,
                            std::shared_ptr<c10::Event> copied) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < params.size(); ++i) {
      landed[params[i]] = grads[i];
      if (copied)
        copies[params[i]] = copied;
    }
  }
  changed.notify_all();
}

void GradientLandings::close(std::optional<std::string> why) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    closed = true;
    if (why && !failure)
      failure = std::move(why);
  }
  changed.notify_all();
}

std::optional<std::pair<std::string, GradientLandings::Grads>>
GradientLandings::next(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mutex);
  Unit *ready = nullptr;
  auto settled = [&] {
    if (failure)
      return true;
    ready = nullptr;
    bool waiting = false;
    for (Unit &unit : units) {
      if (unit.taken)
        continue;
      waiting = true;
      bool all = std::all_of(unit.params.begin(), unit.params.end(),
                             [&](const std::string &param) { return landed.count(param) != 0; });
      if (all) {
        ready = &unit;
        return true;
      }
    }
    return !waiting || closed;
  };
  if (!changed.wait_until(lock, deadline, settled))
    throw std::runtime_error("no offloaded unit's gradients landed in host memory within " +
                             std::to_string(timeout.count() / 1000.0) + " s");
  if (failure)
    throw std::runtime_error("the step failed before the gradients landed: " + *failure);
  if (!ready) {
    for (const Unit &unit : units)
      if (!unit.taken)
        throw std::runtime_error("the step ended without landing the gradients of unit @" + unit.name);
    return std::nullopt;
  }
  ready->taken = true;
  Grads grads;
  std::vector<std::shared_ptr<c10::Event>> pending;
  for (const std::string &param : ready->params) {
    grads[param] = landed.at(param);
    if (auto copy = copies.find(param); copy != copies.end())
      pending.push_back(copy->second);
  }
  std::string name = ready->name;
  lock.unlock();
  for (const std::shared_ptr<c10::Event> &copy : pending)
    if (!completesBy(*copy, deadline))
      throw std::runtime_error("the copies of unit @" + name + "'s gradients to host memory did not finish within " +
                               std::to_string(timeout.count() / 1000.0) + " s of the host thread's wait");
  return std::make_pair(std::move(name), std::move(grads));
}

StepOutputs execute(const Program &program, const Function &function, StepInputs inputs) {
  std::shared_ptr<GradientLandings> landings = inputs.landings;
  try {
    StepOutputs outputs = Executor(program, function, std::move(inputs)).run();
    if (landings)
      landings->close(std::nullopt);
    return outputs;
  } catch (const std::exception &error) {
    if (landings)
      landings->close(error.what());
    throw;
  }
}

} // namespace fsdp_rt
