//===- Memory.cpp - the per-rank memory model of a step ------------------===//

#include "fsdp/Analysis/Memory.h"

#include "fsdp_rt/HostStaging.h"
#include "fsdp_rt/ShardLayout.h"

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// The dtype a reduction reduces in.
Type reduceType(Operation *start) { return start->getAttrOfType<TypeAttr>("reduce_dtype").getValue(); }

/// Bytes of the buffer a reduction reduces into: its results, each in the
/// reduce dtype.
int64_t reducedBytes(Operation *start) {
  int64_t bytes = 0;
  for (Type result : futureTypes(start))
    bytes += cast<RankedTensorType>(result).getNumElements() * elementBytes(reduceType(start));
  return bytes;
}

/// Bytes of a collective's staging buffers, which the runtime allocates at
/// the start and frees at the wait. An all-gather packs this rank's shards
/// into its row of the receive buffer and gathers in place (NCCL's in-place
/// all-gather; on Gloo an all-reduce). With NCCL a reduce-scatter packs the
/// padded full tensors and receives one shard of each, except over one
/// rank, where it reduces the packed buffer in place. With Gloo the runtime
/// reduces in place instead (Gloo's own reduce-scatter copies through
/// temporaries): a reduce-scatter has only its packed buffer (its row is
/// kept at the wait, as the gradients).
/// An all-reduce works in place on its packed buffer either way.
/// A host all-gather on a GPU also holds, from its start to its wait, the
/// buffer through which the shards it casts cross in chunks
/// (fsdp_rt/HostStaging.h). An all-gather `into_results` on NCCL
/// stages nothing: each shard is cast into its place in the result, which
/// is gathered in place (on Gloo it still receives, and copies into the
/// results at the wait).
int64_t stagingBytes(Operation *start, int64_t ranks, bool gloo, bool hostIsDevice) {
  if (auto gather = dyn_cast<AllGatherStartOp>(start)) {
    Type wire = cast<RankedTensorType>(futureTypes(start).front()).getElementType();
    int64_t sent = 0, largestCast = 0;
    for (Value input : gather.getInputs()) {
      auto type = cast<RankedTensorType>(input.getType());
      sent += type.getNumElements() * elementBytes(wire);
      if (gather.getHost() && !hostIsDevice && type.getElementType() != wire)
        largestCast = std::max(largestCast, tensorBytes(type));
    }
    if (gather.getIntoResults() && !gloo) // never `host` (the verifier's rule)
      return 0;
    return sent * ranks + fsdp_rt::hostCastStagingBytes(largestCast);
  }
  int64_t shards = reducedBytes(start);
  if (isa<AllReduceStartOp>(start))
    return shards;
  return shards * ranks + (gloo || ranks == 1 ? 0 : shards);
}

/// Whether a reduction's results (those in its reduce dtype) are views of
/// the buffer it reduces into: an all-reduce's packed buffer, NCCL's
/// receive buffer (over one rank the packed buffer). Gloo's reduce-scatter
/// copies this rank's row out of its packed buffer instead.
bool reducesIntoResults(Operation *start, bool gloo) { return isa<AllReduceStartOp>(start) || !gloo; }

/// Bytes of an `into_results` all-gather's result as the start allocates
/// it: padded to the group size times the shard's rows.
int64_t paddedResultBytes(Value result, int64_t ranks) {
  auto type = cast<RankedTensorType>(result.getType());
  int64_t rows = type.getDimSize(0);
  int64_t padded = fsdp_rt::Dim0ShardLayout::create(rows, ranks)->paddedRows();
  return rows == 0 ? 0 : tensorBytes(type) / rows * padded;
}

} // namespace

bool mlir::fsdp::computesStorage(Operation *op) {
  return isa<AtenOp, PointwiseOp, CastOp, AllSliceOp>(op) && !isViewOf(op);
}

bool mlir::fsdp::handsOverPastStep(Operation *user) {
  return isa<LossOp, GradientsOp>(user) || user->hasTrait<OpTrait::IsTerminator>();
}

bool mlir::fsdp::hostIsDevice(ModuleOp module) {
  auto device = module->getAttrOfType<StringAttr>("fsdp.device");
  return !device || device.getValue() == "cpu";
}

FailureOr<int64_t> mlir::fsdp::optimizerStatesPerElement(StringRef optimizer, Operation *anchor) {
  if (optimizer == "adamw" || optimizer == "adam")
    return 2;
  if (optimizer == "sgd-momentum")
    return 1;
  if (optimizer == "sgd" || optimizer == "none")
    return 0;
  return anchor->emitError() << "unknown optimizer '" << optimizer
                             << "'; use adamw, adam, sgd-momentum, sgd or none";
}

int64_t mlir::fsdp::localBytes(ParamOp param, SymbolTableCollection &tables) {
  RankedTensorType local = param.getLogicalType();
  if (param.isSharded()) {
    auto grid = tables.lookupNearestSymbolFrom<shard::GridOp>(param, param.getGridAttr());
    int64_t ranks = groupSize(grid, *param.getGridAxes());
    SmallVector<int64_t> shape(local.getShape());
    shape[0] = (shape[0] + ranks - 1) / ranks;
    local = RankedTensorType::get(shape, local.getElementType());
  }
  return tensorBytes(local);
}

ParamState mlir::fsdp::paramState(ParamOp param, SymbolTableCollection &tables, int64_t statesPerElement) {
  int64_t shard = localBytes(param, tables);
  return param.isTrainable() ? ParamState{shard, shard, statesPerElement * shard} : ParamState{shard, 0, 0};
}

Persistent mlir::fsdp::persistentState(ModuleOp module, Step &step, int64_t statesPerElement) {
  Persistent state;
  state.hostIsDevice = hostIsDevice(module);
  SymbolTableCollection tables;
  for (ParamOp param : module.getOps<ParamOp>()) {
    ParamState bytes = paramState(param, tables, statesPerElement);
    bool host = param.isOffloaded();
    (host ? state.hostParams : state.params) += bytes.shard;
    (host ? state.hostGrads : state.grads) += bytes.grad;
    (host ? state.hostOptimizer : state.optimizer) += bytes.optimizer;
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

/// Walks the schedule in program order, tracking the storage the step
/// allocates: the same lifetimes the runtime follows (fsdp.release and
/// fsdp.reshard free; a value nothing releases lives to the end of the step).
Walk mlir::fsdp::walkSchedule(Step &step, bool gloo, bool hostIsDevice, Frees frees) {
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
      auto grid = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(&op, op.getAttrOfType<FlatSymbolRefAttr>("grid"));
      int64_t ranks = groupSize(grid, op.getAttrOfType<DenseI16ArrayAttr>("grid_axes").asArrayRef());
      storages.push_back({stagingBytes(&op, ranks, gloo, hostIsDevice), here, index[wait], Staging, Value(), {}});
      if (op.hasAttr("host") && !isa<AllGatherStartOp>(op) && !hostIsDevice) {
        // Gradients that go to host memory: only a cast to their dtype
        // passes through the device, within the wait.
        Type reduce = reduceType(&op);
        int64_t casts = 0;
        for (Value result : wait.getResults())
          if (cast<RankedTensorType>(result.getType()).getElementType() != reduce)
            casts += tensorBytes(result.getType());
        storages.push_back({casts, index[wait], index[wait], Staging, Value(), {}});
        continue;
      }
      auto gather = dyn_cast<AllGatherStartOp>(op);
      if (gather && gather.getIntoResults()) { // the start allocates the results, padded
        for (Value result : wait.getResults()) {
          allocate(result, here, Gathered);
          storages.back().bytes = paddedResultBytes(result, ranks);
        }
        continue;
      }
      if (!gather && reducesIntoResults(&op, gloo)) {
        // The results in the reduce dtype are views of the buffer reduced
        // into: it is staging until the wait, then their storage until the
        // last of them is freed; the others are cast from it at the wait.
        Type reduce = reduceType(&op);
        SmallVector<Value> views;
        for (Value result : wait.getResults())
          if (cast<RankedTensorType>(result.getType()).getElementType() == reduce)
            views.push_back(result);
        if (!views.empty()) {
          int64_t reduced = reducedBytes(&op);
          Storage &staging = storages.back();
          staging.bytes -= reduced;
          storages.push_back({reduced, here, index[wait] - 1, Staging, Value(), {}});
          for (Value view : views)
            storageOf[view] = storages.size();
          storages.push_back({reduced, index[wait], -1, Gradient, views.front(), views});
        }
        for (Value result : wait.getResults())
          if (!storageOf.count(result))
            allocate(result, index[wait], Gradient);
        continue;
      }
      for (Value result : wait.getResults())
        allocate(result, index[wait], gather ? Gathered : Gradient);
      continue;
    }
    if (computesStorage(&op))
      for (Value result : op.getResults())
        if (isa<RankedTensorType>(result.getType()))
          allocate(result, here, Activation);
  }
  // A storage is freed when its last alias is: at the alias's release or
  // reshard (or its last use, or its definition when nothing reads it, as
  // plan-lifetimes will release it); never when the step hands it over
  // (loss, gradients) or nothing releases it.
  bool byLastUse = frees == Frees::AfterLastUse;
  auto freedAt = [&](Value alias) -> int64_t {
    int64_t at = -1;
    for (Operation *user : alias.getUsers()) {
      if (handsOverPastStep(user))
        return end;
      Operation *top = body.findAncestorOpInBlock(*user);
      if (byLastUse || isa<ReleaseOp, ReshardOp>(top))
        at = std::max(at, index[top]);
    }
    if (at < 0 && byLastUse)
      return index[alias.getDefiningOp()];
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
  int64_t lossIndex = step.loss ? index[step.loss] : end;
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

int64_t mlir::fsdp::devicePeak(ModuleOp module, Step &step, int64_t statesPerElement, bool gloo) {
  Persistent state = persistentState(module, step, statesPerElement);
  return state.total() - state.madeByStep() + walkSchedule(step, gloo, state.hostIsDevice).peak;
}
