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
  /// Offloaded units' shards, gradients and optimizer state, in host memory.
  int64_t hostParams = 0, hostGrads = 0, hostOptimizer = 0;
  bool hostIsDevice = false;
  int64_t host() const { return hostParams + hostGrads + hostOptimizer; }
  int64_t total() const {
    return params + grads + optimizer + buffers + batch + accumulation + (hostIsDevice ? host() : 0);
  }
  /// What the step makes itself: the gradients of the device (the walk
  /// counts them from their reduction's wait).
  int64_t madeByStep() const { return grads + (hostIsDevice ? hostGrads : 0); }
};

/// Whether the module runs where host memory is the device's (a CPU target).
bool hostIsDevice(ModuleOp module) {
  auto device = module->getAttrOfType<StringAttr>("fsdp.device");
  return !device || device.getValue() == "cpu";
}

struct Walk {
  int64_t peak = 0, peakGathered = 0, peakActivations = 0, peakStaging = 0, peakGradients = 0;
  int64_t mostGathered = 0; // gathered parameters alive at once, at any point
  Operation *peakOp = nullptr;
  int64_t savedActivations = 0;
  SmallVector<int64_t> timeline; // bytes allocated by the step, live after each op
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
  state.hostIsDevice = hostIsDevice(module);
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
    auto unit = tables.lookupNearestSymbolFrom<UnitOp>(param, param.getUnitAttr());
    bool host = unit && unit.getOffloaded();
    (host ? state.hostParams : state.params) += tensorBytes(local);
    if (param.isTrainable()) {
      (host ? state.hostGrads : state.grads) += tensorBytes(local);
      (host ? state.hostOptimizer : state.optimizer) += statesPerElement * tensorBytes(local);
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

/// Bytes of a collective's staging buffers, which the runtime allocates at
/// the start and frees at the wait. With NCCL an all-gather packs the shards
/// and receives every rank's; a reduce-scatter packs the padded full
/// tensors and receives one shard of each. With Gloo the runtime reduces in
/// place instead (Gloo's own all-gather and reduce-scatter copy through
/// temporaries): an all-gather has only its receive buffer, a reduce-scatter
/// only its packed buffer (its row is kept at the wait, as the gradients).
/// An all-reduce works in place on its packed buffer either way.
/// A host all-gather on a GPU also holds a device copy of each shard it
/// casts, from its start to its wait.
int64_t stagingBytes(Operation *start, bool gloo, bool hostIsDevice) {
  auto grid = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(
      start, start->getAttrOfType<FlatSymbolRefAttr>("grid"));
  int64_t ranks = groupSize(grid, start->getAttrOfType<DenseI16ArrayAttr>("grid_axes").asArrayRef());
  if (auto gather = dyn_cast<AllGatherStartOp>(start)) {
    Type wire = cast<RankedTensorType>(futureTypes(start).front()).getElementType();
    int64_t sent = 0, castCopies = 0;
    for (Value input : gather.getInputs()) {
      auto type = cast<RankedTensorType>(input.getType());
      sent += type.getNumElements() * elementBytes(wire);
      if (gather.getHost() && !hostIsDevice && type.getElementType() != wire)
        castCopies += tensorBytes(type);
    }
    return sent * ranks + (gloo ? 0 : sent) + castCopies;
  }
  Type reduce = start->getAttrOfType<TypeAttr>("reduce_dtype").getValue();
  int64_t shards = 0;
  for (Type result : futureTypes(start))
    shards += cast<RankedTensorType>(result).getNumElements() * elementBytes(reduce);
  if (isa<AllReduceStartOp>(start))
    return shards;
  return shards * ranks + (gloo ? 0 : shards);
}

/// Walks the schedule in program order, tracking the storage the step
/// allocates: the same lifetimes the runtime follows (fsdp.release and
/// fsdp.reshard free; a value nothing releases lives to the end of the step).
Walk walkSchedule(Step &step, bool gloo, bool hostIsDevice) {
  Block &body = step.body();
  DenseMap<Operation *, int64_t> index;
  for (auto [i, op] : llvm::enumerate(body))
    index[&op] = i;
  int64_t end = body.getOperations().size();

  enum Kind { Gathered, Activation, Staging, Gradient, NumKinds };
  struct Storage {
    int64_t bytes, allocated, freed;
    Kind kind;
    Value value;                 // null for staging buffers
    SmallVector<Value> aliases;  // the value and its views
  };
  DenseMap<Value, size_t> storageOf; // value or view -> its storage
  SmallVector<Storage> storages;
  auto allocate = [&](Value value, int64_t at, Kind kind) {
    storageOf[value] = storages.size();
    storages.push_back({tensorBytes(value.getType()), at, -1, kind, value, {value}});
  };
  for (Operation &op : body) {
    int64_t here = index[&op];
    if (isViewOf(&op)) {
      auto it = storageOf.find(op.getOperand(0));
      if (it == storageOf.end())
        continue;
      size_t source = it->second; // inserting below invalidates `it`
      for (Value result : op.getResults()) {
        storageOf[result] = source;
        storages[source].aliases.push_back(result);
      }
      continue;
    }
    if (isCollectiveStart(&op)) {
      WaitOp wait = waitOf(&op);
      storages.push_back({stagingBytes(&op, gloo, hostIsDevice), here, index[wait], Staging, Value(), {}});
      if (op.hasAttr("host") && !isa<AllGatherStartOp>(op) && !hostIsDevice) {
        // Gradients that go to host memory: only a cast to their dtype
        // passes through the device, within the wait.
        Type reduce = op.getAttrOfType<TypeAttr>("reduce_dtype").getValue();
        int64_t casts = 0;
        for (Value result : wait.getResults())
          if (cast<RankedTensorType>(result.getType()).getElementType() != reduce)
            casts += tensorBytes(result.getType());
        storages.push_back({casts, index[wait], index[wait], Staging, Value(), {}});
        continue;
      }
      for (Value result : wait.getResults())
        allocate(result, index[wait], isa<AllGatherStartOp>(op) ? Gathered : Gradient);
      continue;
    }
    if (isa<AtenOp, CastOp, AllSliceOp>(op))
      for (Value result : op.getResults())
        if (isa<RankedTensorType>(result.getType()))
          allocate(result, here, Activation);
  }
  // A storage is freed when its last alias is: at the alias's release or
  // reshard; never when the step hands it over (loss, gradients) or nothing
  // releases it.
  auto freedAt = [&](Value alias) -> int64_t {
    int64_t at = -1;
    for (Operation *user : alias.getUsers()) {
      if (isa<LossOp, GradientsOp>(user) || user->hasTrait<OpTrait::IsTerminator>())
        return end;
      if (isa<ReleaseOp, ReshardOp>(user))
        at = index[body.findAncestorOpInBlock(*user)];
    }
    return at < 0 ? end : at;
  };
  for (Storage &storage : storages)
    if (storage.value) {
      storage.freed = 0;
      for (Value alias : storage.aliases)
        storage.freed = std::max(storage.freed, freedAt(alias));
    }

  SmallVector<SmallVector<int64_t>> byKind(NumKinds, SmallVector<int64_t>(end + 1, 0));
  for (Storage &storage : storages) {
    byKind[storage.kind][storage.allocated] += storage.bytes;
    byKind[storage.kind][std::min(storage.freed + 1, end)] -= storage.bytes;
  }
  Walk walk;
  SmallVector<int64_t> live(NumKinds, 0);
  int64_t peakIndex = 0;
  for (int64_t i = 0; i < end; ++i) {
    int64_t total = 0;
    for (int kind = 0; kind < NumKinds; ++kind)
      total += live[kind] += byKind[kind][i];
    walk.timeline.push_back(total);
    walk.mostGathered = std::max(walk.mostGathered, live[Gathered]);
    if (total > walk.peak) {
      walk.peak = total;
      walk.peakGathered = live[Gathered];
      walk.peakActivations = live[Activation];
      walk.peakStaging = live[Staging];
      walk.peakGradients = live[Gradient];
      peakIndex = i;
    }
  }
  walk.peakOp = &*std::next(body.begin(), peakIndex);
  int64_t lossIndex = index[step.loss];
  for (Storage &storage : storages) {
    if (storage.kind == Activation && storage.allocated < lossIndex && storage.freed > lossIndex)
      walk.savedActivations += storage.bytes;
    if (storage.value && storage.allocated <= peakIndex && storage.freed >= peakIndex)
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
    if (backend != "gloo" && backend != "nccl") {
      module.emitError() << "unknown collective backend '" << backend << "'; use gloo or nccl";
      return signalPassFailure();
    }
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
