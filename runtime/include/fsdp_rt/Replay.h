//===- Replay.h - steps replayed as CUDA graphs -----------------*- C++ -*-===//
//
// A function the program marks `cuda_graph` (fsdp-cuda-graph) runs its
// first call as instructions, on a stream of its own, so that NCCL's
// communicators, cuBLAS's workspaces and the kernels are set up outside any
// capture (the memory that call cached for that stream is released after
// it); its second call is captured into a CUDA graph on that stream;
// later calls copy the batch into the graph's inputs and replay it: one
// launch instead of one per instruction.
//
// A replay reads the parameters, buffers and process groups it captured:
// each is checked by address, shape and dtype before every replay, and a
// changed one is captured anew (the call's outputs name it, and the driver
// warns). The outputs a call returns read the graph's
// memory; any still held when the next call replays is first moved to
// memory of its own (its storage swapped under its holders), so it keeps
// its value. A traced call, or one checking reshard frees, runs as
// instructions: it is about the instructions. A failed capture leaves no
// allocator routed to the graph's pool; where every group of the step has
// one rank the step runs as instructions from then on (the outputs say
// why), elsewhere the call throws.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_REPLAY_H
#define FSDP_RT_REPLAY_H

#include "fsdp_rt/Executor.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fsdp_rt {

class GraphedStep;

/// The graphs of one loaded program, one per replayed function.
class ReplayedSteps {
public:
  ReplayedSteps();
  ~ReplayedSteps();
  GraphedStep &of(const Function &function);
  /// Lets every graph and its memory go (outputs still held are copied out
  /// first); each is captured again at its function's next call.
  void release();
  /// The functions whose graph is captured now.
  std::vector<std::string> captured();

private:
  std::mutex choosing;
  std::map<std::string, std::unique_ptr<GraphedStep>> steps;
};

/// Runs `function` of `program`: as instructions (execute), or through its
/// CUDA graph where the program replays it.
StepOutputs run(const Program &program, const Function &function, StepInputs inputs);

} // namespace fsdp_rt

#endif // FSDP_RT_REPLAY_H
