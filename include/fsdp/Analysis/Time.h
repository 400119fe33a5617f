//===- Time.h - the predicted time of a step on a GPU ------------*- C++ -*-===//
//
// A model of one rank's step on a GPU, read from the compiled schedule: each
// instruction in program order, issued by a host thread that spends a fixed
// time per instruction, onto the streams the runtime uses (compute, one per
// communication group as NCCL keeps one per communicator, and the transfer
// stream of offloaded units). Compute kernels cost their roofline time;
// collectives cost a ring model over the link their group crosses; a wait
// holds the compute stream until its collective ends. docs/design.md ("The
// cost model") states every rule and where each constant comes from.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_ANALYSIS_TIME_H
#define FSDP_ANALYSIS_TIME_H

#include "fsdp/Analysis/Step.h"
#include "llvm/ADT/StringMap.h"

#include <string>

namespace mlir::fsdp {

/// A GPU, its links and its host, in SI units (bytes, FLOP/s, bytes/s).
struct GpuKind {
  std::string name;
  int64_t memory = 0;            // the device's total as nvidia-smi reports it
  double tensorFlops = 0;        // dense bf16/f16 tensor-core peak
  double fp32Flops = 0;          // fp32 matmul peak (no TF32, PyTorch's default)
  double memoryBandwidth = 0;
  double intraNodeBandwidth = 0; // collective bus bandwidth inside a node
  double interNodeBandwidth = 0; // collective bus bandwidth per GPU across nodes
  double hostLinkBandwidth = 0;  // pinned host <-> device copies
};

/// The kinds the planner knows by name ("h100-sxm", ...), or null.
const GpuKind *lookupGpuKind(StringRef key);
/// Their names, comma-separated, for messages.
std::string gpuKindList();

/// The GPU plus the constants of the software on it. Efficiencies and
/// latencies default to what PyTorch's kernels and NCCL reach on Hopper
/// (docs/design.md, "The cost model", says where each comes from).
struct Machine {
  GpuKind gpu;
  int64_t gpusPerNode = 8;
  double collectiveLatency = 15e-6;     // one collective, whatever its size
  double intraNodeHopLatency = 1e-6;    // per ring step inside a node
  double interNodeHopLatency = 5e-6;    // per ring step across nodes
  double hostOptimizerBandwidth = 20e9; // bytes/s an optimizer step streams on the host
  double matmulEfficiency = 0.7;
  double attentionEfficiency = 0.45;
  double memoryEfficiency = 0.8;
  double shortestKernel = 3e-6; // a kernel's time on the GPU, however small
  // Host time to issue one instruction: the runtime's, on the H100 host of
  // the GPU issue, where the launch-bound GPT-23M step (905 instructions)
  // took 28.6 ms.
  double issueTime = 30e-6;
};

/// Checks that every number of `machine` is in range; errors on `anchor`.
LogicalResult checkMachine(const Machine &machine, Operation *anchor);

/// What one compute instruction does, for the roofline.
struct OpWork {
  enum Kind { View, Matmul, Attention, Memory } kind = Memory;
  double flops = 0;
  double bytes = 0;     // read plus written
  bool tensorCores = false; // bf16/f16 operands
  /// A memory pass before the kernel: `addmm` onto a tensor of the result's
  /// size first copies it into the result (ATen, CPU and CUDA alike), then
  /// the GEMM accumulates onto it.
  double copyBytes = 0;
};
OpWork workOf(Operation *op);

/// The kernel class a measured profile's calls are counted in ("matmul",
/// "attention", "memory"; "view" launches nothing), by the operator's name
/// as profilers print it ("aten::mul", no overload), for every `fsdp.aten`
/// of `step`: the one definition `fsdpc plan --profile` reads.
llvm::StringMap<std::string> kernelClasses(Step &step);

/// One interval of the predicted step, on one track.
struct Interval {
  std::string name;
  int track = 0; // index into StepTime::tracks
  double begin = 0, end = 0;
  Operation *op = nullptr;
  double flops = 0;
  int64_t bytes = 0;
};

/// The prediction for one step function, seconds unless named otherwise.
struct StepTime {
  double step = 0;            // one step, optimizer included
  double compute = 0;         // kernels on the compute stream
  double communication = 0;  // collectives on their streams
  double exposedCommunication = 0; // compute stream idle waiting for collectives
  double hostBound = 0;       // compute stream idle waiting for the host to issue
  double transfer = 0;        // host <-> device copies of offloaded units
  double optimizer = 0;       // device and host optimizer steps, after the schedule
  double hostOptimizer = 0;   // the host's share of `optimizer`
  // Kernel time at the full peak or bandwidth, by kernel class: what a
  // measured profile divides by to calibrate the efficiencies.
  double idealMatmul = 0, idealAttention = 0, idealMemory = 0;
  double flops = 0;           // every kernel, recomputation included
  double modelFlops = 0;      // without recomputation: what MFU counts
  int64_t instructions = 0;
  SmallVector<std::string> tracks;
  SmallVector<Interval> intervals;
};

/// When the host steps offloaded units (ShardedModule.overlap_host_optimizer).
enum class HostOptimizerTiming {
  AfterStep,   // once the step's transfers are done, before the next step
  NextForward, // during the next step, each unit before its gather
  InBackward,  // each unit from when its gradients land, the rest during the next step
};

/// Predicts `step` on `machine`; `statesPerElement` is the optimizer's state
/// tensors per parameter element (optimizerStatesPerElement). Overlapped
/// timings predict the steady state: each step inherits what the host
/// thread has left of the one before.
StepTime predictStep(ModuleOp module, Step &step, const Machine &machine, int64_t statesPerElement,
                     HostOptimizerTiming timing = HostOptimizerTiming::AfterStep);

} // namespace mlir::fsdp

#endif // FSDP_ANALYSIS_TIME_H
