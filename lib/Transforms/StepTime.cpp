//===- StepTime.cpp - the predicted time of a step, and its trace ---------===//
//
// Before: a scheduled step. After: the IR unchanged, a report of one rank's
// predicted step on a GPU (lib/Analysis/Time.cpp is the model):
//
//   predicted step per rank: @train_step on H100 SXM 80GB (8 GPUs per node)
//     step                        141.20 ms
//     compute kernels             122.02 ms   49.61 TFLOP (49.61 without recomputation)
//     collectives                  11.84 ms   on their own streams
//     exposed communication         0.41 ms   compute waiting for collectives
//     ...
//
// and, with `trace`, the predicted step as Chrome trace events
// (ui.perfetto.dev): one track per stream, one complete event per kernel,
// copy, collective and wait.
//
// Test: test/Transforms/step-time.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Memory.h"
#include "fsdp/Analysis/Time.h"
#include "fsdp/Transforms/Passes.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"

#include <cmath>

namespace mlir::fsdp {
#define GEN_PASS_DEF_STEPTIMEPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

llvm::json::Object kernelClassesJson(Step &step) {
  llvm::json::Object classes;
  for (const auto &entry : kernelClasses(step))
    classes[entry.getKey().str()] = entry.getValue(); // owned: the map is a temporary
  return classes;
}

llvm::json::Object machineJson(const Machine &machine, StringRef kind) {
  const GpuKind &gpu = machine.gpu;
  return llvm::json::Object{{"kind", kind},
                            {"name", gpu.name},
                            {"memory_bytes", gpu.memory},
                            {"tensor_flops", gpu.tensorFlops},
                            {"fp32_flops", gpu.fp32Flops},
                            {"memory_bandwidth", gpu.memoryBandwidth},
                            {"intra_node_bandwidth", gpu.intraNodeBandwidth},
                            {"inter_node_bandwidth", gpu.interNodeBandwidth},
                            {"host_link_bandwidth", gpu.hostLinkBandwidth},
                            {"gpus_per_node", machine.gpusPerNode},
                            {"host_optimizer_bandwidth", machine.hostOptimizerBandwidth},
                            {"matmul_efficiency", machine.matmulEfficiency},
                            {"attention_efficiency", machine.attentionEfficiency},
                            {"memory_efficiency", machine.memoryEfficiency},
                            {"collective_latency_s", machine.collectiveLatency},
                            {"issue_s", machine.issueTime},
                            {"shortest_kernel_s", machine.shortestKernel}};
}

/// FLOPs in TFLOP, or GFLOP below one TFLOP.
std::string flopCount(double flops) {
  return flops >= 1e12 ? llvm::formatv("{0:F2} TFLOP", flops / 1e12).str()
                       : llvm::formatv("{0:F3} GFLOP", flops / 1e9).str();
}

/// Seconds as trace microseconds, to the nanosecond.
double microseconds(double seconds) { return std::round(seconds * 1e9) / 1e3; }

llvm::json::Array traceEvents(const StepTime &time, int64_t process, StringRef function) {
  llvm::json::Array events;
  events.push_back(llvm::json::Object{{"name", "process_name"}, {"ph", "M"}, {"pid", process},
                                      {"args", llvm::json::Object{{"name", ("@" + function).str()}}}});
  for (auto [index, track] : llvm::enumerate(time.tracks))
    events.push_back(llvm::json::Object{{"name", "thread_name"}, {"ph", "M"}, {"pid", process},
                                        {"tid", int64_t(index + 1)},
                                        {"args", llvm::json::Object{{"name", track}}}});
  for (const Interval &interval : time.intervals) {
    llvm::json::Object args;
    if (interval.op) {
      std::string where;
      llvm::raw_string_ostream(where) << interval.op->getLoc();
      args["location"] = where;
    }
    if (interval.bytes)
      args["bytes"] = interval.bytes;
    if (interval.flops)
      args["flops"] = interval.flops;
    events.push_back(llvm::json::Object{{"name", interval.name},
                                        {"ph", "X"},
                                        {"pid", process},
                                        {"tid", int64_t(interval.track + 1)},
                                        {"ts", microseconds(interval.begin)},
                                        {"dur", microseconds(interval.end - interval.begin)},
                                        {"args", std::move(args)}});
  }
  return events;
}

struct StepTimePass : public fsdp::impl::StepTimePassBase<StepTimePass> {
  using StepTimePassBase::StepTimePassBase;

  /// The kind's numbers with the options that were given laid over them.
  FailureOr<Machine> machine(ModuleOp module) {
    Machine machine;
    if (gpu != "custom") {
      const GpuKind *kind = lookupGpuKind(gpu);
      if (!kind)
        return module.emitError() << "unknown GPU kind '" << gpu << "'; use " << gpuKindList()
                                  << ", or custom with memory-gib, tensor-tflops, fp32-tflops, memory-gbps, "
                                     "intra-node-gbps, inter-node-gbps and host-link-gbps";
      machine.gpu = *kind;
    } else {
      machine.gpu.name = "custom GPU";
    }
    auto over = [](double given, double &field, double scale) {
      if (given != 0)
        field = given * scale;
    };
    double memory = double(machine.gpu.memory);
    over(memoryGib, memory, double(1 << 30));
    machine.gpu.memory = int64_t(memory);
    over(tensorTflops, machine.gpu.tensorFlops, 1e12);
    over(fp32Tflops, machine.gpu.fp32Flops, 1e12);
    over(memoryGbps, machine.gpu.memoryBandwidth, 1e9);
    over(intraNodeGbps, machine.gpu.intraNodeBandwidth, 1e9);
    over(interNodeGbps, machine.gpu.interNodeBandwidth, 1e9);
    over(hostLinkGbps, machine.gpu.hostLinkBandwidth, 1e9);
    over(hostOptimizerGbps, machine.hostOptimizerBandwidth, 1e9);
    over(matmulEfficiency, machine.matmulEfficiency, 1);
    over(attentionEfficiency, machine.attentionEfficiency, 1);
    over(memoryEfficiency, machine.memoryEfficiency, 1);
    if (collectiveLatencyUs != -1)
      machine.collectiveLatency = collectiveLatencyUs * 1e-6;
    if (issueUs != -1)
      machine.issueTime = issueUs * 1e-6;
    if (shortestKernelUs != -1)
      machine.shortestKernel = shortestKernelUs * 1e-6;
    machine.gpusPerNode = gpusPerNode;
    if (failed(checkMachine(machine, module)))
      return failure();
    return machine;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<Machine> model = machine(module);
    FailureOr<int64_t> states = optimizerStatesPerElement(optimizer, module);
    if (failed(model) || failed(states) || failed(checkReportFormat(module, format)))
      return signalPassFailure();
    llvm::json::Array reports, events;
    std::string table;
    llvm::raw_string_ostream out(table);
    int64_t process = 0;
    for (Step &step : collectSteps(module)) {
      HostOptimizerTiming timing = hostOptimizerInBackward ? HostOptimizerTiming::InBackward
                                   : overlapHostOptimizer  ? HostOptimizerTiming::NextForward
                                                           : HostOptimizerTiming::AfterStep;
      StepTime time = predictStep(module, step, *model, *states, timing);
      StringRef function = step.func.getSymName();
      double utilization = time.step > 0 ? time.modelFlops / time.step / model->gpu.tensorFlops : 0;
      llvm::json::Array firstInput;
      if (step.func.getNumArguments())
        if (auto tensor = dyn_cast<RankedTensorType>(step.func.getArgumentTypes()[0]))
          for (int64_t dim : tensor.getShape())
            firstInput.push_back(dim);
      reports.push_back(llvm::json::Object{{"function", function},
                                           {"machine", machineJson(*model, gpu)},
                                           {"step_s", time.step},
                                           {"compute_s", time.compute},
                                           {"communication_s", time.communication},
                                           {"exposed_communication_s", time.exposedCommunication},
                                           {"host_bound_s", time.hostBound},
                                           {"transfer_s", time.transfer},
                                           {"optimizer_s", time.optimizer},
                                           {"host_optimizer_s", time.hostOptimizer},
                                           {"flops", time.flops},
                                           {"model_flops", time.modelFlops},
                                           {"model_flops_utilization", utilization},
                                           {"instructions", time.instructions},
                                           {"ideal_s", llvm::json::Object{{"matmul", time.idealMatmul},
                                                                          {"attention", time.idealAttention},
                                                                          {"memory", time.idealMemory}}},
                                           {"first_input_shape", std::move(firstInput)},
                                           {"kernel_classes", kernelClassesJson(step)}});
      auto row = [&](StringRef what, double seconds, const std::string &note) {
        out << llvm::format("  %-26s %10.2f ms", what.str().c_str(), seconds * 1e3)
            << (note.empty() ? "" : "   ") << note << "\n";
      };
      out << "predicted step per rank: @" << function << " on " << model->gpu.name << " ("
          << model->gpusPerNode << " GPUs per node)\n";
      row("step", time.step, "");
      row("compute kernels", time.compute,
          flopCount(time.flops) + " (" + flopCount(time.modelFlops) + " without recomputation)");
      row("collectives", time.communication, "on their own streams");
      row("exposed communication", time.exposedCommunication, "compute waiting for collectives");
      row("host-bound", time.hostBound,
          llvm::formatv("compute waiting for the host to issue ({0} instructions)", time.instructions).str());
      if (time.transfer)
        row("host <-> device copies", time.transfer, "offloaded units, a stream each way");
      row("optimizer step", time.optimizer,
          llvm::formatv("{0:F2} ms of it on the host{1}", time.hostOptimizer * 1e3,
                        timing == HostOptimizerTiming::InBackward    ? ", from when gradients land"
                        : timing == HostOptimizerTiming::NextForward ? ", beside the next step"
                                                                     : "")
              .str());
      out << llvm::format("  %-26s %10.1f %%\n", "model FLOPs utilization", utilization * 100);
      if (!trace.empty())
        for (llvm::json::Value &event : traceEvents(time, ++process, function))
          events.push_back(std::move(event));
    }
    if (!output.empty() && failed(writeReport(module, output, format, std::move(reports), table)))
      return signalPassFailure();
    if (!trace.empty()) {
      llvm::json::Object file{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}};
      if (failed(writeReport(module, trace, "json", std::move(file), "")))
        return signalPassFailure();
    }
    markAllAnalysesPreserved();
  }
};

} // namespace
