//===- ScheduleTrace.cpp - the schedule as a Chrome trace -----------------===//
//
// Before: a scheduled step. After: the IR unchanged, and a JSON file of trace
// events (chrome://tracing, ui.perfetto.dev):
//
//   {"traceEvents": [
//     {"name": "all_gather_start unit @blocks.0", "ph": "X", "pid": 1, "tid": 2,
//      "ts": 0, "dur": 12.5, "args": {...}},
//     {"name": "aten::addmm", "ph": "X", "pid": 1, "tid": 1, "ts": 12.5, ...}, ...]}
//
// One track for compute and one per collective kind; collectives of a kind
// run one at a time in issue order, and a wait holds compute until its
// collective ends. Durations come from the pass's cost model options.
//
// Test: test/Transforms/schedule-trace.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "llvm/Support/JSON.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_SCHEDULETRACEPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

struct ScheduleTracePass : public fsdp::impl::ScheduleTracePassBase<ScheduleTracePass> {
  using ScheduleTracePassBase::ScheduleTracePassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (computeGbps <= 0 || networkGbps <= 0 || latencyUs < 0) {
      module.emitError("trace cost model: bandwidths must be > 0 and latency >= 0");
      return signalPassFailure();
    }
    llvm::json::Array events;
    int64_t process = 0;
    for (Step &step : collectSteps(module)) {
      ++process;
      events.push_back(llvm::json::Object{
          {"name", "process_name"}, {"ph", "M"}, {"pid", process},
          {"args", llvm::json::Object{{"name", ("@" + step.func.getSymName()).str()}}}});
      const char *tracks[] = {"", "compute", "all_gather", "reduce_scatter", "all_reduce"};
      for (int tid = 1; tid <= 4; ++tid)
        events.push_back(llvm::json::Object{{"name", "thread_name"}, {"ph", "M"},
                                            {"pid", process}, {"tid", tid},
                                            {"args", llvm::json::Object{{"name", tracks[tid]}}}});
      double now = 0; // compute stream clock, microseconds
      double streamFree[5] = {0, 0, 0, 0, 0};
      DenseMap<Operation *, double> finishes;
      for (Operation &op : step.body()) {
        std::string name = op.getName().getStringRef().str();
        if (auto aten = dyn_cast<AtenOp>(op))
          name = aten.getCallee().str();
        if (isCollectiveStart(&op)) {
          int tid = isa<AllGatherStartOp>(op) ? 2 : isa<ReduceScatterStartOp>(op) ? 3 : 4;
          int64_t bytes = 0;
          for (Type type : futureTypes(&op))
            bytes += tensorBytes(type);
          for (Value input : op.getOperands())
            bytes = std::max(bytes, tensorBytes(input.getType()));
          double begin = std::max(now, streamFree[tid]);
          double duration = latencyUs + bytes / (networkGbps * 1e3);
          streamFree[tid] = begin + duration;
          finishes[&op] = begin + duration;
          if (auto unit = op.getAttrOfType<FlatSymbolRefAttr>("unit"))
            name += " unit @" + unit.getValue().str();
          events.push_back(llvm::json::Object{
              {"name", name}, {"ph", "X"}, {"pid", process}, {"tid", tid}, {"ts", begin},
              {"dur", duration}, {"args", llvm::json::Object{{"bytes", bytes}}}});
          continue;
        }
        if (auto wait = dyn_cast<WaitOp>(op)) {
          double ready = finishes.lookup(wait.getFuture().getDefiningOp());
          if (ready > now) {
            events.push_back(llvm::json::Object{{"name", "wait"}, {"ph", "X"}, {"pid", process},
                                                {"tid", 1}, {"ts", now}, {"dur", ready - now}});
            now = ready;
          }
          continue;
        }
        if (!isa<AtenOp, CastOp, AllSliceOp>(op))
          continue;
        int64_t bytes = 0;
        for (Type type : op.getResultTypes())
          bytes += tensorBytes(type);
        double duration = std::max(0.1, bytes / (computeGbps * 1e3));
        std::string where;
        llvm::raw_string_ostream(where) << op.getLoc();
        events.push_back(llvm::json::Object{
            {"name", name}, {"ph", "X"}, {"pid", process}, {"tid", 1}, {"ts", now},
            {"dur", duration}, {"args", llvm::json::Object{{"location", where}}}});
        now += duration;
      }
    }
    llvm::json::Object trace{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}};
    if (failed(writeReport(module, output, "json", std::move(trace), "")))
      return signalPassFailure();
    markAllAnalysesPreserved();
  }
};

} // namespace
