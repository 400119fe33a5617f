//===- Replay.cpp - steps replayed as CUDA graphs -------------------------===//
//
// See fsdp_rt/Replay.h. The graph is captured in thread-local mode: other
// threads (NCCL's and fsdpc's watchdogs polling events) go on while this
// one captures. Its memory comes from a pool of its own,
// kept between replays: the step's working memory stays reserved.
//
//===----------------------------------------------------------------------===//

#include "fsdp_rt/Replay.h"

#include <functional>
#include <sstream>
#include <stdexcept>
#include <tuple>

#if FSDP_RT_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/from_blob.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace fsdp_rt {

#if FSDP_RT_CUDA

namespace {

/// What a replay relies on about a tensor it captured.
struct Captured {
  const void *data;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;

  explicit Captured(const at::Tensor &tensor)
      : data(tensor.defined() ? tensor.const_data_ptr() : nullptr),
        sizes(tensor.defined() ? tensor.sizes().vec() : std::vector<int64_t>()),
        strides(tensor.defined() ? tensor.strides().vec() : std::vector<int64_t>()),
        dtype(tensor.defined() ? tensor.scalar_type() : c10::ScalarType::Undefined) {}
  bool operator==(const Captured &other) const = default;
};

using CapturedTable = std::map<std::string, Captured>;

CapturedTable capturedOf(const std::map<std::string, at::Tensor> &table) {
  CapturedTable out;
  for (const auto &[name, tensor] : table)
    out.emplace(name, Captured(tensor));
  return out;
}

/// `to` runs after the work issued on `from` so far.
void join(const c10::cuda::CUDAStream &from, const c10::cuda::CUDAStream &to) {
  at::cuda::CUDAEvent done;
  done.record(from);
  done.block(to);
}

/// A CUDA graph whose failed capture can be abandoned without leaving the
/// caching allocators routing this thread's allocations to its pool, the
/// pool held, or the random generators in capture mode: torch 2.11's
/// capture_end throws before it ends any of them, and its reset() releases
/// the pool only after a successful capture_end. A torch whose reset() does
/// it (it has `capturing_to_pool_`) is left to.
class Graph : public at::cuda::CUDAGraph {
public:
  template <typename Self = Graph> void abandon() {
    if constexpr (!requires(Self &graph) { graph.capturing_to_pool_; }) {
      if (!capture_ended_) {
        // Else every later random op outside a capture fails ("Offset
        // increment outside graph capture"); capture_epilogue is not exported.
        for (auto &[state, increment] : static_cast<Self &>(*this).captured_generator_states_)
          state->capturing_ = false;
        c10::DeviceIndex device = capture_stream_.device_index();
        auto attempt = [](const std::function<void()> &step) {
          try {
            step();
          } catch (const std::exception &) { // one this torch's capture_begin did not start
          }
        };
        attempt([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device, mempool_id_); });
        attempt([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(mempool_id_); });
        attempt([&] { c10::cuda::CUDACachingAllocator::releasePool(device, mempool_id_); });
        attempt([&] { at::getHostAllocator(at::kCUDA)->release_pool(mempool_id_); });
      }
    }
    reset();
  }
};

/// Whether a failed capture may fall back to running the instructions:
/// where no collective in it spans another rank, nothing another rank
/// waits for was left half done.
bool aloneInEveryGroup(const Function &function, const StepInputs &in) {
  for (const Instruction &inst : function.instructions) {
    auto group = in.groups.find(inst.group);
    if (!inst.group.empty() && (group == in.groups.end() || !group->second || group->second->getSize() != 1))
      return false;
  }
  return true;
}

std::string shapeText(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

} // namespace

class GraphedStep {
public:
  ~GraphedStep() {
    try {
      drop();
    } catch (...) { // at exit the CUDA context may be gone: nobody reads them then
    }
  }

  StepOutputs run(const Program &program, const Function &function, StepInputs in) {
    std::lock_guard<std::mutex> lock(running);
    c10::Device device = program.device();
    c10::cuda::CUDAGuard onDevice(device);
    if (state == State::Instructions)
      return execute(program, function, std::move(in));
    c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
    if (!stream)
      stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    join(caller, *stream);
    if (state == State::Cold) {
      StepOutputs out;
      {
        c10::cuda::CUDAStreamGuard onStream(*stream);
        out = execute(program, function, std::move(in));
      }
      join(*stream, caller);
      // The caching allocator keeps freed blocks for the stream they were
      // made on: this call's working memory would stay reserved for the
      // graph's stream, where nothing allocates once the graph (with a pool
      // of its own) replays. Released now, once.
      c10::cuda::CUDACachingAllocator::emptyCache();
      state = State::Warm;
      return out;
    }
    std::string changed = state == State::Captured ? changedInput(in) : "";
    if (!changed.empty()) {
      drop();
      state = State::Warm;
    }
    if (state == State::Warm) {
      std::string failure = capture(program, function, in);
      if (!failure.empty()) {
        state = State::Instructions;
        join(*stream, caller);
        StepOutputs out = execute(program, function, std::move(in));
        out.replayAbandoned = failure;
        return out;
      }
    } else {
      checkBatch(function, in.batch);
      keepHeldOutputs();
      c10::cuda::CUDAStreamGuard onStream(*stream);
      for (size_t i = 0; i < batch.size(); ++i)
        batch[i].copy_(in.batch[i], /*non_blocking=*/true);
    }
    {
      c10::cuda::CUDAStreamGuard onStream(*stream);
      graph->replay();
    }
    join(*stream, caller);
    if (in.deviceWaits) {
      c10::Event done(c10::DeviceType::CUDA);
      done.record(caller);
      in.deviceWaits->add("@" + function.name + " replayed as a CUDA graph (" +
                              std::to_string(outputs.collectives.size()) + " collectives)",
                          firstGroup(function), std::move(done));
    }
    StepOutputs out = handOut();
    out.recapturedFor = changed;
    return out;
  }

  bool captured() {
    std::lock_guard<std::mutex> lock(running);
    return state == State::Captured;
  }

  /// Lets the graph and its memory go; the next call captures it again.
  void release() {
    std::lock_guard<std::mutex> lock(running);
    drop();
    if (state == State::Captured)
      state = State::Warm;
  }

private:
  /// Instructions: a capture failed where running the instructions instead
  /// is safe; every later call does.
  enum class State { Cold, Warm, Captured, Instructions };

  /// The second call: the graph's inputs are copies of this batch, and the
  /// step is captured with them and left to be replayed. Where the capture
  /// fails, its graph and memory pool are abandoned; returns why where the
  /// step may run as instructions instead (aloneInEveryGroup), else throws.
  std::string capture(const Program &program, const Function &function, const StepInputs &in) {
    for (const Instruction &inst : function.instructions) {
      auto group = in.groups.find(inst.group);
      if (inst.group.empty() || group == in.groups.end() || !group->second)
        continue; // the executor names a missing group
      std::string backend = group->second->getBackend(c10::DeviceType::CUDA)->getBackendName();
      if (backend != "nccl")
        throw std::runtime_error("fsdp_rt: @" + function.name + " is replayed as a CUDA graph, but group '" +
                                 inst.group + "' runs " + backend + ", whose collectives a graph cannot capture");
    }
    batch.clear();
    {
      c10::cuda::CUDAStreamGuard onStream(*stream);
      for (const at::Tensor &given : in.batch)
        batch.push_back(given.defined() ? given.contiguous().clone() : given);
    }
    params = capturedOf(in.params);
    buffers = capturedOf(in.buffers);
    groups = in.groups; // held: a group at a reused address is still another group
    StepInputs capturingInputs = in;
    capturingInputs.batch = batch;
    capturingInputs.deviceWaits = nullptr; // the replay notes one event for the whole graph
    // Cached blocks cannot be released while a capture is under way: the
    // graph's pool gets them from the device only if they are free now.
    c10::cuda::CUDACachingAllocator::emptyCache();
    graph = std::make_unique<Graph>();
    c10::cuda::CUDAStreamGuard onStream(*stream);
    bool capturing = false;
    try {
      graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal); // routes the allocators before it can fail
      capturing = true;
      outputs = execute(program, function, std::move(capturingInputs));
      capturing = false;
      graph->capture_end(); // fails where something in the step cannot be captured
    } catch (const std::exception &error) {
      if (capturing) {
        try {
          graph->capture_end();
        } catch (const std::exception &) { // the capture was invalidated: the error above says why
        }
      }
      graph->abandon();
      graph.reset();
      outputs = StepOutputs();
      batch.clear();
      c10::cuda::CUDACachingAllocator::emptyCache();
      // The cause last: CUDA's errors run on over lines that callers cut.
      std::string failed = "@" + function.name + " could not be captured into a CUDA graph";
      if (aloneInEveryGroup(function, in))
        return failed + ": " + error.what();
      throw std::runtime_error("fsdp_rt: " + failed + ", and its collectives span other ranks (compile it without " +
                               "cuda-graph): " + error.what());
    }
    state = State::Captured;
    return "";
  }

  /// The first parameter, buffer or process group that is not the one the
  /// graph captured (another tensor, or one laid out otherwise); "" when
  /// all are.
  std::string changedInput(const StepInputs &in) const {
    for (const auto &[table, captured, what] :
         {std::tuple(&in.params, &params, "parameter"), std::tuple(&in.buffers, &buffers, "buffer")}) {
      CapturedTable now = capturedOf(*table);
      if (now == *captured)
        continue;
      for (const auto &[name, tensor] : now) {
        auto it = captured->find(name);
        if (it == captured->end() || !(it->second == tensor))
          return std::string(what) + " '" + name + "'";
      }
      return std::string(what) + "s (fewer than captured)";
    }
    for (const auto &[key, group] : in.groups) {
      auto it = groups.find(key);
      if (it == groups.end() || it->second != group)
        return "process group '" + key + "'";
    }
    if (in.groups.size() != groups.size())
      return "process groups (fewer than captured)";
    return "";
  }

  /// The batch fits the graph's inputs (what the executor checks on an
  /// eager call).
  void checkBatch(const Function &function, const std::vector<at::Tensor> &given) const {
    if (given.size() != batch.size())
      throw std::runtime_error("fsdp_rt: @" + function.name + " takes " + std::to_string(batch.size()) +
                               " batch tensors, got " + std::to_string(given.size()));
    for (size_t i = 0; i < given.size(); ++i)
      if (!given[i].defined() || given[i].device() != batch[i].device() || given[i].sizes() != batch[i].sizes() ||
          given[i].scalar_type() != batch[i].scalar_type())
        throw std::runtime_error(
            "fsdp_rt: batch tensor " + std::to_string(i) + " of @" + function.name + " is " +
            (given[i].defined() ? shapeText(given[i].sizes()) + " " + c10::toString(given[i].scalar_type()) + " on " +
                                      given[i].device().str()
                                : std::string("undefined")) +
            "; the step was compiled for " + shapeText(batch[i].sizes()) + " " +
            c10::toString(batch[i].scalar_type()) + " on " + batch[i].device().str());
  }

  static std::string firstGroup(const Function &function) {
    for (const Instruction &inst : function.instructions)
      if (!inst.group.empty())
        return inst.group;
    return "";
  }

  /// The outputs of the graph as tensors of their own that read its memory
  /// without owning it; their storages are remembered, to be moved out
  /// before the next replay if still held.
  StepOutputs handOut() {
    StepOutputs out;
    auto view = [&](const at::Tensor &output) {
      if (!output.defined())
        return output;
      // The device is given, not looked up from the pointer: no driver call per output.
      at::Tensor held = at::for_blob(output.data_ptr(), output.sizes())
                            .strides(output.strides())
                            .options(output.options())
                            .target_device(output.device())
                            .make_tensor();
      handedOut.push_back(held.storage().getWeakStorageImpl());
      return held;
    };
    out.loss = view(outputs.loss);
    for (const auto &[name, grad] : outputs.grads)
      out.grads[name] = view(grad);
    for (const at::Tensor &value : outputs.returned)
      out.returned.push_back(view(value));
    out.collectives = outputs.collectives;
    return out;
  }

  /// The graph and its memory go; what its outputs' holders still read is
  /// copied out first, and the copies are done before the memory is free.
  void drop() {
    if (!graph)
      return;
    c10::cuda::CUDAGuard onDevice(stream->device());
    // What the caller queued on held outputs (zeroing or clipping a
    // gradient) runs before they are copied: release() comes between calls.
    join(c10::cuda::getCurrentCUDAStream(stream->device_index()), *stream);
    keepHeldOutputs();
    stream->synchronize();
    outputs = StepOutputs();
    batch.clear();
    graph.reset();
    c10::cuda::CUDACachingAllocator::emptyCache(); // the graph's pool is released, its memory not yet
  }

  /// Outputs of an earlier replay still held (a loss kept, gradients not
  /// zeroed) are copied to memory of their own before the graph writes its
  /// memory again: their holders keep their values.
  void keepHeldOutputs() {
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> handed = std::move(handedOut);
    handedOut.clear();
    for (c10::weak_intrusive_ptr<c10::StorageImpl> &weak : handed) {
      c10::intrusive_ptr<c10::StorageImpl> storage = weak.lock();
      if (!storage || storage->nbytes() == 0)
        continue;
      // Allocated on the caller's stream, where its holders use and free it;
      // copied on the graph's, before the replay, which the caller waits for.
      c10::DataPtr own = c10::cuda::CUDACachingAllocator::get()->allocate(storage->nbytes());
      C10_CUDA_CHECK(cudaMemcpyAsync(own.get(), storage->data(), storage->nbytes(), cudaMemcpyDeviceToDevice,
                                     stream->stream()));
      storage->set_data_ptr_noswap(std::move(own));
    }
  }

  std::mutex running;
  State state = State::Cold;
  std::optional<c10::cuda::CUDAStream> stream;
  std::unique_ptr<Graph> graph;
  std::vector<at::Tensor> batch; // the graph's inputs
  CapturedTable params, buffers;
  std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> groups;
  StepOutputs outputs; // the graph's, in its memory
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> handedOut;
};

GraphedStep &ReplayedSteps::of(const Function &function) {
  std::lock_guard<std::mutex> lock(choosing);
  std::unique_ptr<GraphedStep> &step = steps[function.name];
  if (!step)
    step = std::make_unique<GraphedStep>();
  return *step;
}

void ReplayedSteps::release() {
  std::lock_guard<std::mutex> lock(choosing);
  for (auto &[name, step] : steps)
    step->release();
}

std::vector<std::string> ReplayedSteps::captured() {
  std::lock_guard<std::mutex> lock(choosing);
  std::vector<std::string> names;
  for (auto &[name, step] : steps)
    if (step->captured())
      names.push_back(name);
  return names;
}

StepOutputs run(const Program &program, const Function &function, StepInputs inputs) {
  if (!function.cudaGraph || inputs.trace || inputs.checkReshardFrees || !program.replays())
    return execute(program, function, std::move(inputs));
  return program.replays()->of(function).run(program, function, std::move(inputs));
}

#else

class GraphedStep {};

void ReplayedSteps::release() {}

std::vector<std::string> ReplayedSteps::captured() { return {}; }

GraphedStep &ReplayedSteps::of(const Function &function) {
  throw std::runtime_error("fsdp_rt: @" + function.name +
                           " is replayed as a CUDA graph, and this runtime was built against a torch without CUDA");
}

StepOutputs run(const Program &program, const Function &function, StepInputs inputs) {
  return execute(program, function, std::move(inputs));
}

#endif

ReplayedSteps::ReplayedSteps() = default;
ReplayedSteps::~ReplayedSteps() = default;

} // namespace fsdp_rt
