//===- MemoryReport.cpp - per-rank memory of a sharded step ---------------===//
//
// Before: a scheduled step. After: the same IR with the numbers attached, and
// a report (table or JSON) written:
//
//   func.func @train_step(...) attributes {fsdp.memory = {grads = 40 : i64,
//       optimizer = 80 : i64, params = 40 : i64, peak = 1234 : i64, ...}}
//
// Model: the state that exists when the step starts (parameter shards,
// optimizer state, buffers, the batch) plus a walk of the schedule in program
// order that follows the runtime's rules exactly: a collective's staging
// buffers live from its start to its wait, its results from the wait; any
// other computed value from its op; each is freed where fsdp.reshard or
// fsdp.release (see fsdp-plan-lifetimes) drops its last alias, since views
// share their source's storage; gradient shards and unreleased values live
// to the end. What ATen allocates inside one operator is not modelled.
// An offloaded unit's shards, gradients and optimizer state are host memory,
// reported apart; on a GPU its gradients leave the device at their wait, and
// a host all-gather holds device copies of the shards it casts until its
// wait. On a CPU target host memory is the device's, and counts in the peak.
//
// Test: test/Transforms/memory-report.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Memory.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_MEMORYREPORTPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

std::string describe(Value value) {
  std::string text;
  llvm::raw_string_ostream os(text);
  if (Operation *def = value.getDefiningOp()) {
    os << def->getName();
    if (auto aten = dyn_cast<AtenOp>(def))
      os << " " << aten.getCallee() << (aten.getModule() ? " in '" + aten.getModule()->str() + "'" : "");
    if (auto wait = dyn_cast<WaitOp>(def))
      if (auto unit = wait.getFuture().getDefiningOp()->getAttrOfType<FlatSymbolRefAttr>("unit"))
        os << " of unit " << unit;
    os << " " << value.getType() << " at " << def->getLoc();
  }
  return text;
}

std::string mib(int64_t bytes) {
  std::string text;
  llvm::raw_string_ostream(text) << llvm::format("%.3f MiB", bytes / 1048576.0);
  return text;
}

struct MemoryReportPass : public fsdp::impl::MemoryReportPassBase<MemoryReportPass> {
  using MemoryReportPassBase::MemoryReportPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<int64_t> states = optimizerStatesPerElement(optimizer, module);
    if (failed(states))
      return signalPassFailure();
    if (failed(checkReportFormat(module, format)))
      return signalPassFailure();
    if (failed(checkBackend(module, backend)))
      return signalPassFailure();
    llvm::json::Array reports;
    std::string table;
    llvm::raw_string_ostream out(table);
    Builder builder(module.getContext());
    for (Step &step : collectSteps(module)) {
      Persistent state = persistentState(module, step, *states);
      Walk walk = walkSchedule(step, backend == "gloo", state.hostIsDevice);
      // Gradient shards are made by the step (the walk counts them from their
      // reduction's wait); the rest exists when the step starts.
      int64_t atStart = state.total() - state.madeByStep();
      int64_t total = atStart + walk.peak;
      auto attr = [&](StringRef name, int64_t value) {
        return builder.getNamedAttr(name, builder.getI64IntegerAttr(value));
      };
      step.func->setAttr("fsdp.memory", builder.getDictionaryAttr(
          {attr("params", state.params), attr("grads", state.grads),
           attr("optimizer", state.optimizer), attr("buffers", state.buffers),
           attr("batch", state.batch), attr("grad_accumulation", state.accumulation),
           attr("peak_above_step_start", walk.peak), attr("peak_gathered_params", walk.peakGathered),
           attr("peak_activations", walk.peakActivations),
           attr("saved_activations", walk.savedActivations), attr("peak_total", total),
           attr("host", state.host())}));

      llvm::json::Array largest;
      for (auto &[bytes, value] : walk.largestAtPeak)
        largest.push_back(llvm::json::Object{{"bytes", bytes}, {"value", describe(value)}});
      std::string peakLoc;
      llvm::raw_string_ostream(peakLoc) << walk.peakOp->getLoc();
      reports.push_back(llvm::json::Object{
          {"function", step.func.getSymName()},
          {"optimizer", optimizer},
          {"persistent", llvm::json::Object{{"params", state.params}, {"grads", state.grads},
                                            {"optimizer", state.optimizer},
                                            {"buffers", state.buffers}, {"batch", state.batch},
                                            {"grad_accumulation", state.accumulation},
                                            {"total", state.total()},
                                            {"at_step_start", atStart}}},
          {"host", llvm::json::Object{{"params", state.hostParams}, {"grads", state.hostGrads},
                                      {"optimizer", state.hostOptimizer}, {"total", state.host()},
                                      {"counted_in_peak", state.hostIsDevice}}},
          {"peak", llvm::json::Object{{"total", total}, {"above_step_start", walk.peak},
                                      {"gathered_params", walk.peakGathered},
                                      {"activations", walk.peakActivations},
                                      {"staging", walk.peakStaging},
                                      {"gradients", walk.peakGradients},
                                      {"op", walk.peakOp->getName().getStringRef()},
                                      {"location", peakLoc}, {"largest", std::move(largest)}}},
          {"saved_activations", walk.savedActivations},
          {"most_gathered_params", walk.mostGathered},
          {"timeline", llvm::json::Array(walk.timeline)}});

      out << "memory per rank: @" << step.func.getSymName() << " (optimizer " << optimizer << ")\n";
      for (auto [name, bytes] : {std::pair{"parameter shards", state.params},
                                 std::pair{"gradient shards", state.grads},
                                 std::pair{"optimizer state", state.optimizer},
                                 std::pair{"buffers", state.buffers},
                                 std::pair{"batch", state.batch},
                                 std::pair{"gradient accumulation", state.accumulation}})
        out << llvm::format("  %-24s %14lld B  %s\n", name, (long long)bytes, mib(bytes).c_str());
      if (state.host())
        out << llvm::format("  %-24s %14lld B  %s%s\n", "offloaded to host", (long long)state.host(),
                            mib(state.host()).c_str(),
                            state.hostIsDevice ? " (host memory is the device's: in the peak)" : "");
      out << llvm::format("  %-24s %14lld B  %s\n", "peak (persistent + live)",
                          (long long)total, mib(total).c_str());
      out << llvm::format("    %-22s %14lld B  %s\n", "above the step's start", (long long)walk.peak,
                          mib(walk.peak).c_str());
      out << llvm::format("    %-22s %14lld B\n", "gathered parameters", (long long)walk.peakGathered);
      out << llvm::format("    %-22s %14lld B\n", "activations", (long long)walk.peakActivations);
      out << llvm::format("    %-22s %14lld B\n", "collective staging", (long long)walk.peakStaging);
      out << llvm::format("    %-22s %14lld B\n", "gradient shards", (long long)walk.peakGradients);
      out << "    at " << walk.peakOp->getName() << " " << peakLoc << "\n";
      for (auto &[bytes, value] : walk.largestAtPeak)
        out << llvm::format("      %12lld B  ", (long long)bytes) << describe(value) << "\n";
      out << llvm::format("  %-24s %14lld B  %s\n", "most gathered at once", (long long)walk.mostGathered,
                          mib(walk.mostGathered).c_str());
      out << llvm::format("  %-24s %14lld B  %s\n", "saved for backward",
                          (long long)walk.savedActivations, mib(walk.savedActivations).c_str());
    }
    if (failed(writeReport(module, output, format, std::move(reports), table)))
      return signalPassFailure();
    markAllAnalysesPreserved();
  }
};

} // namespace
