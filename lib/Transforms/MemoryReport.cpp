//===- MemoryReport.cpp - per-rank memory of a sharded step ---------------===//
//
// Before: a scheduled step. After: the same IR with the numbers attached, and
// a report (table or JSON) written:
//
//   func.func @train_step(...) attributes {fsdp.memory = {grads = 40 : i64,
//       optimizer = 80 : i64, params = 40 : i64, peak = 1234 : i64, ...}}
//
// Model: persistent state per rank (parameter shards, gradient shards,
// optimizer state, buffers, the batch) plus a walk of the schedule in program
// order. A gathered parameter is allocated when its all-gather starts and
// released by reshard; an activation lives from its definition to its last
// use, and views share their source's storage; a collective keeps its inputs
// alive until its wait.
//
// Test: test/Transforms/memory-report.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
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

struct Persistent {
  int64_t params = 0, grads = 0, optimizer = 0, buffers = 0, batch = 0, accumulation = 0;
  int64_t total() const { return params + grads + optimizer + buffers + batch + accumulation; }
};

struct Walk {
  int64_t peak = 0, peakGathered = 0, peakActivations = 0, peakInFlight = 0;
  Operation *peakOp = nullptr;
  int64_t savedActivations = 0;
  SmallVector<int64_t> timeline; // live transient bytes after each op
  SmallVector<std::pair<int64_t, Value>> largestAtPeak;
};

FailureOr<int64_t> optimizerStatesPerElement(StringRef optimizer, Operation *anchor) {
  if (optimizer == "adamw" || optimizer == "adam")
    return 2;
  if (optimizer == "sgd-momentum")
    return 1;
  if (optimizer == "sgd" || optimizer == "none")
    return 0;
  return anchor->emitError() << "unknown optimizer '" << optimizer
                             << "'; use adamw, adam, sgd-momentum, sgd or none";
}

Persistent persistentState(ModuleOp module, Step &step, int64_t statesPerElement) {
  Persistent state;
  SymbolTableCollection tables;
  for (ParamOp param : module.getOps<ParamOp>()) {
    RankedTensorType local = param.getLogicalType();
    if (param.isSharded()) {
      auto grid = tables.lookupNearestSymbolFrom<shard::GridOp>(param, param.getGridAttr());
      int64_t ranks = groupSize(grid, *param.getGridAxes());
      SmallVector<int64_t> shape(local.getShape());
      shape[0] = (shape[0] + ranks - 1) / ranks;
      local = RankedTensorType::get(shape, local.getElementType());
    }
    state.params += tensorBytes(local);
    if (param.isTrainable()) {
      state.grads += tensorBytes(local);
      state.optimizer += statesPerElement * tensorBytes(local);
    }
  }
  for (BufferOp buffer : module.getOps<BufferOp>())
    state.buffers += tensorBytes(buffer.getType());
  for (Type type : step.func.getArgumentTypes())
    state.batch += tensorBytes(type);
  step.func.walk([&](GetAccumulatedGradOp read) {
    state.accumulation += tensorBytes(read.getResult().getType());
  });
  return state;
}

/// Walks the schedule, tracking transient storage.
Walk walkSchedule(Step &step) {
  Block &body = step.body();
  DenseMap<Operation *, int64_t> index;
  for (auto [i, op] : llvm::enumerate(body))
    index[&op] = i;

  // Storage roots: what allocates, when it is allocated and freed, and its kind.
  enum Kind { Gathered, Activation, InFlight };
  struct Storage {
    int64_t bytes, allocated, freed;
    Kind kind;
    Value value;
  };
  DenseMap<Value, Value> rootOf; // view -> the value owning its storage
  DenseMap<Value, size_t> storageOf;
  SmallVector<Storage> storages;
  auto root = [&](Value value) {
    auto it = rootOf.find(value);
    return it == rootOf.end() ? value : it->second;
  };
  for (Operation &op : body) {
    int64_t here = index[&op];
    if (isViewOf(&op)) {
      for (Value result : op.getResults())
        rootOf[result] = root(op.getOperand(0));
      continue;
    }
    if (isCollectiveStart(&op)) {
      WaitOp wait = waitOf(&op);
      for (Value result : wait.getResults()) {
        Kind kind = isa<AllGatherStartOp>(op) ? Gathered : InFlight;
        // Reduction results land in the persistent gradient shards.
        if (kind == InFlight)
          continue;
        storageOf[result] = storages.size();
        storages.push_back({tensorBytes(result.getType()), here, -1, kind, result});
      }
      continue;
    }
    if (isa<AtenOp, CastOp, AllSliceOp>(op))
      for (Value result : op.getResults()) {
        storageOf[result] = storages.size();
        storages.push_back({tensorBytes(result.getType()), here, -1, Activation, result});
      }
  }
  // Frees: reshard for gathered buffers; last use (through views, and a
  // collective's wait) for the rest.
  for (Operation &op : body) {
    int64_t here = index[&op];
    if (auto reshard = dyn_cast<ReshardOp>(op)) {
      for (Value buffer : reshard.getBuffers())
        if (storageOf.count(buffer))
          storages[storageOf[buffer]].freed = here;
      continue;
    }
    int64_t until = here;
    if (isCollectiveStart(&op))
      until = index[waitOf(&op)];
    op.walk([&](Operation *nested) {
      for (Value operand : nested->getOperands()) {
        auto it = storageOf.find(root(operand));
        if (it == storageOf.end() || storages[it->second].kind == Gathered)
          continue;
        storages[it->second].freed = std::max(storages[it->second].freed, until);
      }
    });
  }
  int64_t end = body.getOperations().size();
  SmallVector<int64_t> delta(end + 1, 0);
  SmallVector<SmallVector<int64_t>> byKind(3, SmallVector<int64_t>(end + 1, 0));
  for (Storage &storage : storages) {
    int64_t freed = storage.freed < 0 ? (storage.kind == Gathered ? end : storage.allocated)
                                      : storage.freed;
    delta[storage.allocated] += storage.bytes;
    delta[freed + 1 > end ? end : freed + 1] -= storage.bytes;
    byKind[storage.kind][storage.allocated] += storage.bytes;
    byKind[storage.kind][freed + 1 > end ? end : freed + 1] -= storage.bytes;
    storage.freed = freed;
  }
  Walk walk;
  int64_t live = 0, gathered = 0, activations = 0, inFlight = 0, peakIndex = 0;
  int64_t lossIndex = index[step.loss];
  for (int64_t i = 0; i < end; ++i) {
    live += delta[i];
    gathered += byKind[Gathered][i];
    activations += byKind[Activation][i];
    inFlight += byKind[InFlight][i];
    walk.timeline.push_back(live);
    if (live > walk.peak) {
      walk.peak = live;
      walk.peakGathered = gathered;
      walk.peakActivations = activations;
      walk.peakInFlight = inFlight;
      peakIndex = i;
    }
  }
  walk.peakOp = &*std::next(body.begin(), peakIndex);
  for (Storage &storage : storages) {
    if (storage.kind == Activation && storage.allocated < lossIndex && storage.freed > lossIndex)
      walk.savedActivations += storage.bytes;
    if (storage.allocated <= peakIndex && storage.freed >= peakIndex)
      walk.largestAtPeak.push_back({storage.bytes, storage.value});
  }
  llvm::sort(walk.largestAtPeak, [](auto &a, auto &b) { return a.first > b.first; });
  if (walk.largestAtPeak.size() > 5)
    walk.largestAtPeak.resize(5);
  return walk;
}

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
    llvm::json::Array reports;
    std::string table;
    llvm::raw_string_ostream out(table);
    Builder builder(module.getContext());
    for (Step &step : collectSteps(module)) {
      Persistent state = persistentState(module, step, *states);
      Walk walk = walkSchedule(step);
      int64_t total = state.total() + walk.peak;
      auto attr = [&](StringRef name, int64_t value) {
        return builder.getNamedAttr(name, builder.getI64IntegerAttr(value));
      };
      step.func->setAttr("fsdp.memory", builder.getDictionaryAttr(
          {attr("params", state.params), attr("grads", state.grads),
           attr("optimizer", state.optimizer), attr("buffers", state.buffers),
           attr("batch", state.batch), attr("grad_accumulation", state.accumulation),
           attr("peak_transient", walk.peak), attr("peak_gathered_params", walk.peakGathered),
           attr("peak_activations", walk.peakActivations),
           attr("saved_activations", walk.savedActivations), attr("peak_total", total)}));

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
                                            {"total", state.total()}}},
          {"peak", llvm::json::Object{{"total", total}, {"transient", walk.peak},
                                      {"gathered_params", walk.peakGathered},
                                      {"activations", walk.peakActivations},
                                      {"in_flight_gradients", walk.peakInFlight},
                                      {"op", walk.peakOp->getName().getStringRef()},
                                      {"location", peakLoc}, {"largest", std::move(largest)}}},
          {"saved_activations", walk.savedActivations},
          {"timeline", llvm::json::Array(walk.timeline)}});

      out << "memory per rank: @" << step.func.getSymName() << " (optimizer " << optimizer << ")\n";
      for (auto [name, bytes] : {std::pair{"parameter shards", state.params},
                                 std::pair{"gradient shards", state.grads},
                                 std::pair{"optimizer state", state.optimizer},
                                 std::pair{"buffers", state.buffers},
                                 std::pair{"batch", state.batch},
                                 std::pair{"gradient accumulation", state.accumulation}})
        out << llvm::format("  %-24s %14lld B  %s\n", name, (long long)bytes, mib(bytes).c_str());
      out << llvm::format("  %-24s %14lld B  %s\n", "peak (persistent + live)",
                          (long long)total, mib(total).c_str());
      out << llvm::format("    %-22s %14lld B\n", "gathered parameters", (long long)walk.peakGathered);
      out << llvm::format("    %-22s %14lld B\n", "activations", (long long)walk.peakActivations);
      out << llvm::format("    %-22s %14lld B\n", "in-flight gradients", (long long)walk.peakInFlight);
      out << "    at " << walk.peakOp->getName() << " " << peakLoc << "\n";
      for (auto &[bytes, value] : walk.largestAtPeak)
        out << llvm::format("      %12lld B  ", (long long)bytes) << describe(value) << "\n";
      out << llvm::format("  %-24s %14lld B  %s\n", "saved for backward",
                          (long long)walk.savedActivations, mib(walk.savedActivations).c_str());
    }
    if (failed(writeReport(module, output, format, std::move(reports), table)))
      return signalPassFailure();
    markAllAnalysesPreserved();
  }
};

} // namespace
