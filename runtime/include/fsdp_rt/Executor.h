//===- Executor.h - run one function of a program ---------------*- C++ -*-===//
//
// Executes a loaded program's instructions in order on one rank, on the
// device the program was loaded for (every tensor the driver passes must be
// there). Values live in slots and are dropped exactly where the program says
// (release, reshard); a collective's staging buffers live from its start to
// its wait. The executor makes no decisions; errors name the rank, the
// instruction and the user's source line.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_EXECUTOR_H
#define FSDP_RT_EXECUTOR_H

#include "fsdp_rt/Collectives.h"
#include "fsdp_rt/Program.h"

#include <c10/core/Event.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace fsdp_rt {

/// Another thread's update of an offloaded unit's shards (the host
/// optimizer stepping them while the step runs): the unit's host
/// all-gather waits for it before it reads the shards.
class HostUpdate {
public:
  /// The shards hold their new values.
  void finish();
  /// The update failed with `why`; the step raises it at the unit's gather.
  void fail(std::string why);
  /// Blocks until finished; throws the failure, or a timeout after `timeout`.
  void wait(std::chrono::milliseconds timeout, const std::string &unit) const;

private:
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  bool done = false;
  std::optional<std::string> failure;
};

/// Offloaded units' gradients reaching host memory during a step, handed to
/// a host optimizer that steps each unit from there, while the step's
/// backward goes on (ShardedModule.overlap_host_optimizer(in_backward=True)).
/// The executor lands each host reduction's gradients as it waits for it;
/// the host thread takes whole units, the first landed in its own order.
class GradientLandings {
public:
  using Grads = std::map<std::string, at::Tensor>;
  /// `units`: each unit with the parameters whose gradients it waits for,
  /// in the order the host thread prefers to step them.
  explicit GradientLandings(std::vector<std::pair<std::string, std::vector<std::string>>> units);

  /// The executor: these gradients are in host memory once `copied` has
  /// completed (null: already).
  void land(const std::vector<std::string> &params, const std::vector<at::Tensor> &grads,
            std::shared_ptr<c10::Event> copied);
  /// The executor: the step ended; `failure` says why it failed, if it did.
  void close(std::optional<std::string> failure);

  /// The host thread: the first unit, in the constructor's order, whose
  /// gradients have all landed and been copied, and its gradients; blocks
  /// until there is one, or returns nullopt once every unit was taken.
  /// Throws if the step failed, or ended without landing a unit's
  /// gradients, or after `timeout`.
  std::optional<std::pair<std::string, Grads>> next(std::chrono::milliseconds timeout);

private:
  struct Unit {
    std::string name;
    std::vector<std::string> params;
    bool taken = false;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Unit> units;
  Grads landed;
  std::map<std::string, std::shared_ptr<c10::Event>> copies;
  bool closed = false;
  std::optional<std::string> failure;
};

/// What one rank brings to a call.
struct StepInputs {
  std::map<std::string, at::Tensor> params, buffers, accumulated;
  std::vector<at::Tensor> batch;
  std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> groups;
  std::chrono::milliseconds timeout{300000};
  /// Updates still running on offloaded units' shards, by unit.
  std::map<std::string, std::shared_ptr<const HostUpdate>> hostUpdates;
  bool trace = false;
  /// Test hook: check at every reshard that the gathered storage is gone.
  bool checkReshardFrees = false;
  /// Where the collectives whose waits do not block the host (NCCL) are
  /// noted as they are waited for; the caller holds them against the
  /// step's deadline, and seals them once the step returned. Null: not
  /// noted.
  std::shared_ptr<DeviceWaits> deviceWaits;
  /// Where host reductions land offloaded units' gradients for a host
  /// optimizer stepping in backward; null: nobody takes them before the
  /// step returns.
  std::shared_ptr<GradientLandings> landings;
  /// Whether host reductions land their results (offloaded units'
  /// gradients) in pinned host memory: CPUOffloadPolicy(pin_memory). Pinned,
  /// their copies run beside the step; else each copy holds the host.
  bool pinHostResults = true;
};

/// One instruction as it ran: wall-clock microseconds since the epoch.
struct TraceEvent {
  std::string name, category, detail;
  int64_t startUs, durationUs;
};

struct StepOutputs {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  std::vector<at::Tensor> returned;
  std::vector<TraceEvent> trace;
  std::vector<IssuedCollective> collectives;
  /// checkReshardFrees: gathered buffers that something kept alive past their reshard.
  std::vector<std::string> reshardLeaks;
  /// A step replayed as a CUDA graph that this call captured anew: the
  /// input that changed since the last capture (fsdp_rt/Replay.h).
  std::string recapturedFor;
  /// A step whose capture failed where it may run as instructions instead
  /// (every group of one rank): why; this and every later call do.
  std::string replayAbandoned;
};

/// Runs `function` of `program` on the device it was loaded for; throws
/// std::runtime_error on failure.
StepOutputs execute(const Program &program, const Function &function, StepInputs inputs);

} // namespace fsdp_rt

#endif // FSDP_RT_EXECUTOR_H
