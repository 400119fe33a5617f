//===- Executor.h - run one function of a program ---------------*- C++ -*-===//
//
// Executes a loaded program's instructions in order on one rank. Values live
// in slots and are dropped exactly where the program says (release, reshard);
// a collective's staging buffers live from its start to its wait. The
// executor makes no decisions; errors name the rank, the instruction and the
// user's source line.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_EXECUTOR_H
#define FSDP_RT_EXECUTOR_H

#include "fsdp_rt/Program.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

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

/// One collective as the executor issued it to the backend: the c10d
/// operation, the bytes of the buffer it reduced (all_reduce), gathered into
/// (all_gather) or scattered from (reduce_scatter), and the group's size.
struct IssuedCollective {
  std::string op;
  int64_t bytes, ranks;
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

/// Runs `function` of a loaded program; throws std::runtime_error on failure.
StepOutputs execute(const Function &function, StepInputs inputs);

} // namespace fsdp_rt

#endif // FSDP_RT_EXECUTOR_H
