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

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace fsdp_rt {

/// What one rank brings to a call.
struct StepInputs {
  std::map<std::string, at::Tensor> params, buffers, accumulated;
  std::vector<at::Tensor> batch;
  std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> groups;
  std::chrono::milliseconds timeout{300000};
  bool trace = false;
  /// Test hook: check at every reshard that the gathered storage is gone.
  bool checkReshardFrees = false;
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
};

/// Runs `function` of `program` on the device it was loaded for; throws
/// std::runtime_error on failure.
StepOutputs execute(const Program &program, const Function &function, StepInputs inputs);

} // namespace fsdp_rt

#endif // FSDP_RT_EXECUTOR_H
