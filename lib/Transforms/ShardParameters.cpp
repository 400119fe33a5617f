//===- ShardParameters.cpp - shard parameters, insert collectives ---------===//
//
// Before (a captured step):
//
//   fsdp.param @w : tensor<10x4xf32> unit @u
//   %w = fsdp.get_param @w : tensor<10x4xf32>
//   %y = fsdp.aten "aten::mm" (%x, %w) ...
//   ...
//   %g = fsdp.aten "aten::mm" (...)              // last producer of w's grad
//   fsdp.gradients [@w] %g : tensor<10x4xf32>
//
// After (ranks=4):
//
//   shard.grid @fsdp_grid(shape = 4)
//   fsdp.param @w : tensor<10x4xf32> unit @u sharded on @fsdp_grid axes = [0] padding = 2
//   %s = fsdp.get_param @w : tensor<3x4xf32>
//   %f = fsdp.all_gather_start %s on @fsdp_grid axes = [0] unit @u
//          : tensor<3x4xf32> -> !fsdp.future<tensor<10x4xf32>>
//   %w = fsdp.wait %f : !fsdp.future<tensor<10x4xf32>>
//   %y = fsdp.aten "aten::mm" (%x, %w) ...
//   %g = fsdp.aten "aten::mm" (...)
//   %r = fsdp.reduce_scatter_start %g on @fsdp_grid axes = [0] reduction = average
//          reduce_dtype = f32 unit @u : tensor<10x4xf32> -> !fsdp.future<tensor<3x4xf32>>
//   %gs = fsdp.wait %r : !fsdp.future<tensor<3x4xf32>>
//   fsdp.gradients [@w] %gs : tensor<3x4xf32>
//
// A sum over ranks the model makes (SyncBatchNorm's statistics) becomes an
// all-reduce over the whole grid:
//
//   %t = fsdp.data_parallel_sum %s : tensor<16xf32>
//   ==>
//   %f = fsdp.all_reduce_start %s on @fsdp_grid axes = [0] reduction = sum
//          reduce_dtype = f32 : tensor<16xf32> -> !fsdp.future<tensor<16xf32>>
//   %t = fsdp.wait %f : !fsdp.future<tensor<16xf32>>
//
// Test: test/Transforms/shard-parameters.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"
#include "fsdp_rt/ShardLayout.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_SHARDPARAMETERSPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

enum class Strategy { FullShard, ShardGradOp, HybridShard, NoShard };

/// The grid and the axes parameters are sharded over / gradients averaged
/// over, derived from the options.
struct Layout {
  Strategy strategy;
  SmallVector<int64_t> gridShape;
  SmallVector<int16_t> shardAxes;     // empty for no-shard
  SmallVector<int16_t> replicateAxes; // hybrid: the replica axis; no-shard: all
  int64_t shardRanks = 1;
  int64_t replicaRanks = 1;
};

FailureOr<Layout> makeLayout(ModuleOp module, StringRef strategyName, int64_t ranks,
                             int64_t replicas, int64_t reshardGroup) {
  Layout layout;
  if (strategyName == "full-shard")
    layout.strategy = Strategy::FullShard;
  else if (strategyName == "shard-grad-op")
    layout.strategy = Strategy::ShardGradOp;
  else if (strategyName == "hybrid-shard")
    layout.strategy = Strategy::HybridShard;
  else if (strategyName == "no-shard")
    layout.strategy = Strategy::NoShard;
  else
    return module.emitError() << "unknown strategy '" << strategyName
                              << "'; use full-shard, shard-grad-op, hybrid-shard or no-shard";
  if (ranks < 1 || replicas < 1)
    return module.emitError() << "ranks and replicas must be >= 1, got ranks=" << ranks
                              << " replicas=" << replicas;
  if (replicas > 1 && layout.strategy != Strategy::HybridShard)
    return module.emitError("replicas > 1 needs strategy=hybrid-shard");
  if (reshardGroup != 0 && (reshardGroup < 1 || ranks % reshardGroup != 0))
    return module.emitError() << "reshard-group " << reshardGroup
                              << " must divide ranks (" << ranks << ")";
  if (reshardGroup != 0 && layout.strategy != Strategy::FullShard)
    return module.emitError("reshard-group (integer reshard-after-forward) needs strategy=full-shard");

  if (layout.strategy == Strategy::NoShard) {
    layout.gridShape = {ranks};
    layout.replicateAxes = {0};
    layout.replicaRanks = ranks;
    return layout;
  }
  int16_t next = 0;
  if (layout.strategy == Strategy::HybridShard) {
    layout.gridShape.push_back(replicas);
    layout.replicateAxes = {next++};
    layout.replicaRanks = replicas;
  }
  if (reshardGroup > 1 && reshardGroup < ranks) {
    layout.gridShape.append({ranks / reshardGroup, reshardGroup});
    layout.shardAxes = {next, static_cast<int16_t>(next + 1)};
  } else {
    layout.gridShape.push_back(ranks);
    layout.shardAxes = {next};
  }
  layout.shardRanks = ranks;
  return layout;
}

/// How a gradient reduction divides. FSDP2's averaging over the reduction's
/// `ranks`: AVG for fp32/bf16; for fp16, SUM with a power-of-two pre-divide
/// near sqrt(N) and the rest after, against overflow. With a gradient divide
/// factor F (FSDP2's set_gradient_divide_factor) every reduction sums, and a
/// gradient is divided by F once: at its first reduction (`first`), not at a
/// hybrid mesh's all-reduce across replicas.
struct Averaging {
  shard::ReductionKind kind = shard::ReductionKind::Average;
  FloatAttr preDivide, postDivide;
};

Averaging averagingFor(Type gradElement, int64_t ranks, double divideFactor, bool first, Builder &builder) {
  Averaging averaging;
  double divide = static_cast<double>(ranks);
  if (divideFactor > 0) {
    averaging.kind = shard::ReductionKind::Sum;
    if (!first || divideFactor == 1.0)
      return averaging;
    divide = divideFactor;
  } else if (!gradElement.isF16() || ranks == 1) {
    return averaging;
  }
  averaging.kind = shard::ReductionKind::Sum;
  int64_t pre = gradElement.isF16() && divide == std::floor(divide) ? fp16PreDivide(static_cast<int64_t>(divide)) : 1;
  if (pre > 1)
    averaging.preDivide = builder.getF64FloatAttr(static_cast<double>(pre));
  averaging.postDivide = builder.getF64FloatAttr(divide / static_cast<double>(pre));
  return averaging;
}

class ParameterSharder {
public:
  ParameterSharder(ModuleOp module, Layout layout, bool gradientAccumulation, double divideFactor,
                   ArrayRef<std::string> ignored)
      : module(module), layout(std::move(layout)), builder(module.getContext()),
        gradientAccumulation(gradientAccumulation), divideFactor(divideFactor), ignored(ignored) {}

  LogicalResult run() {
    if (SymbolTable::lookupSymbolIn(module, kGridName))
      return module.emitError() << "the module already has @" << kGridName
                                << "; it is sharded already";
    SmallVector<Step> steps = collectSteps(module);
    if (steps.empty())
      return module.emitError("no training step (a function with fsdp.loss) to shard");
    if (failed(markIgnored()))
      return failure();
    declareGrid();
    for (ParamOp param : module.getOps<ParamOp>())
      if (failed(shardParam(param)))
        return failure();
    for (Step &step : steps) {
      if (gradientAccumulation)
        addNoSyncStep(step);
      gatherParameters(step.func);
      if (step.gradients)
        reduceGradients(step, /*accumulated=*/gradientAccumulation);
    }
    lowerDataParallelSums();
    return success();
  }

private:
  /// Marks the parameters `ignored` names (by FQN or tied name) ignored.
  LogicalResult markIgnored() {
    FailureOr<SmallVector<ParamOp>> named = paramsNamed(module, ignored, "ignored-params");
    if (failed(named))
      return failure();
    for (ParamOp param : *named)
      param.setIgnored(true);
    return success();
  }

  void declareGrid() {
    builder.setInsertionPointToStart(module.getBody());
    grid = shard::GridOp::create(builder, module.getLoc(), kGridName, layout.gridShape);
    gridRef = FlatSymbolRefAttr::get(grid.getSymNameAttr());
  }

  LogicalResult shardParam(ParamOp param) {
    if (param.isSharded())
      return param.emitOpError("is sharded already");
    shardTypes[param.getSymName()] = param.getLogicalType();
    if (layout.shardAxes.empty() || param.getIgnored())
      return success();
    RankedTensorType logical = param.getLogicalType();
    // A scalar has no rows to shard: it stays whole on every rank and its
    // gradient is averaged over the whole grid.
    if (logical.getRank() == 0)
      return success();
    auto shardLayout = fsdp_rt::Dim0ShardLayout::create(logical.getDimSize(0), layout.shardRanks);
    SmallVector<int64_t> shape(logical.getShape());
    shape[0] = shardLayout->shardRows();
    param.setGridAttr(gridRef);
    param.setGridAxes(layout.shardAxes);
    param.setPadding(shardLayout->paddingRows());
    shardTypes[param.getSymName()] = RankedTensorType::get(shape, logical.getElementType());
    params[param.getSymName()] = param;
    return success();
  }

  /// Every read of a sharded parameter becomes a read of the shard and a
  /// gather of it, placed where the read was (the first use).
  void gatherParameters(func::FuncOp func) {
    SmallVector<GetParamOp> reads;
    func.walk([&](GetParamOp read) { reads.push_back(read); });
    for (GetParamOp read : reads) {
      ParamOp param = params.lookup(read.getName());
      if (!param)
        continue;
      RankedTensorType full = read.getResult().getType();
      read.getResult().setType(shardTypes[read.getName()]);
      builder.setInsertionPointAfter(read);
      auto start = AllGatherStartOp::create(
          builder, read.getLoc(), FutureType::get(builder.getContext(), {full}),
          ValueRange{read.getResult()}, gridRef,
          builder.getDenseI16ArrayAttr(layout.shardAxes), param.getUnitAttr(), IntegerAttr());
      auto wait = WaitOp::create(builder, read.getLoc(), start.getFuture());
      read.getResult().replaceAllUsesExcept(wait.getResult(0), start);
    }
  }

  /// Reduces each gradient right after its last producer: reduce-scatter to
  /// the shard (then all-reduce across replicas for hybrid sharding), or
  /// all-reduce over the grid for no-shard and for parameters kept whole.
  void reduceGradients(Step &step, bool accumulated) {
    GradientsOp gradients = step.gradients;
    SmallVector<Value> replicaInputs;
    SmallVector<unsigned> replicaSlots;
    for (auto [index, attr] : llvm::enumerate(gradients.getParams())) {
      StringRef name = cast<FlatSymbolRefAttr>(attr).getValue();
      Value grad = gradients.getGrads()[index];
      Operation *producer = grad.getDefiningOp();
      if (producer && producer->getBlock() == gradients->getBlock())
        builder.setInsertionPointAfter(producer);
      else
        builder.setInsertionPoint(gradients);
      Location loc = producer ? producer->getLoc() : gradients.getLoc();
      auto paramOp = SymbolTable::lookupNearestSymbolFrom<ParamOp>(gradients, cast<FlatSymbolRefAttr>(attr));
      if (accumulated) {
        auto acc = GetAccumulatedGradOp::create(builder, loc, grad.getType(), cast<FlatSymbolRefAttr>(attr));
        grad = AtenOp::create(builder, loc, TypeRange{grad.getType()},
                              builder.getStringAttr("aten::add.Tensor"), ValueRange{grad, acc.getResult()},
                              builder.getArrayAttr({builder.getIndexAttr(0), builder.getIndexAttr(1),
                                                    builder.getI64IntegerAttr(1)}),
                              UnitAttr(), StringAttr(), IntegerAttr())
                   .getResult(0);
      }
      auto gradType = cast<RankedTensorType>(grad.getType());
      Value reduced;
      if (paramOp.getIgnored()) {
        reduced = grad; // this rank's own
      } else if (!params.contains(name) && !layout.shardAxes.empty()) {
        reduced = allReduce(grad, paramOp.getUnitAttr(), loc, everyAxis(), layout.shardRanks * layout.replicaRanks,
                            /*first=*/true);
      } else if (!layout.shardAxes.empty()) {
        Averaging averaging =
            averagingFor(gradType.getElementType(), layout.shardRanks, divideFactor, /*first=*/true, builder);
        RankedTensorType shardType = shardTypes[name];
        auto start = ReduceScatterStartOp::create(
            builder, loc, FutureType::get(builder.getContext(), {shardType}), ValueRange{grad},
            gridRef, builder.getDenseI16ArrayAttr(layout.shardAxes),
            shard::ReductionKindAttr::get(builder.getContext(), averaging.kind),
            TypeAttr::get(gradType.getElementType()), averaging.preDivide, averaging.postDivide,
            paramOp.getUnitAttr());
        reduced = WaitOp::create(builder, loc, start.getFuture()).getResult(0);
      } else {
        reduced = allReduce(grad, paramOp.getUnitAttr(), loc, layout.replicateAxes, layout.replicaRanks,
                            /*first=*/true);
      }
      gradients.getGradsMutable()[index].set(reduced);
      if (layout.strategy == Strategy::HybridShard && params.contains(name)) {
        replicaInputs.push_back(reduced);
        replicaSlots.push_back(index);
      }
    }
    // Hybrid: average the shards across replicas at the end of backward, one
    // all-reduce per gradient for bucketing to merge per unit.
    builder.setInsertionPoint(gradients);
    for (auto [value, slot] : llvm::zip(replicaInputs, replicaSlots)) {
      auto attr = cast<FlatSymbolRefAttr>(gradients.getParams()[slot]);
      auto paramOp = SymbolTable::lookupNearestSymbolFrom<ParamOp>(gradients, attr);
      gradients.getGradsMutable()[slot].set(allReduce(value, paramOp.getUnitAttr(), value.getLoc(),
                                                      layout.replicateAxes, layout.replicaRanks, /*first=*/false));
    }
  }

  /// Each `fsdp.data_parallel_sum` (in every function, the no-sync copies
  /// too) becomes a sum over the whole grid.
  void lowerDataParallelSums() {
    SmallVector<DataParallelSumOp> sums;
    module.walk([&](DataParallelSumOp sum) { sums.push_back(sum); });
    for (DataParallelSumOp sum : sums) {
      builder.setInsertionPoint(sum);
      auto type = cast<RankedTensorType>(sum.getInput().getType());
      auto start = AllReduceStartOp::create(
          builder, sum.getLoc(), FutureType::get(builder.getContext(), {type}), ValueRange{sum.getInput()},
          gridRef, builder.getDenseI16ArrayAttr(everyAxis()),
          shard::ReductionKindAttr::get(builder.getContext(), shard::ReductionKind::Sum),
          TypeAttr::get(type.getElementType()), FloatAttr(), FloatAttr(), FlatSymbolRefAttr());
      sum.replaceAllUsesWith(WaitOp::create(builder, sum.getLoc(), start.getFuture()).getResult(0));
      sum.erase();
    }
  }

  SmallVector<int16_t> everyAxis() const {
    SmallVector<int16_t> axes;
    for (size_t axis = 0; axis < layout.gridShape.size(); ++axis)
      axes.push_back(static_cast<int16_t>(axis));
    return axes;
  }

  /// Averages `value` over the ranks of `axes` (`ranks` of them), or sums
  /// it (a gradient divide factor), dividing if it is the `first` reduction.
  Value allReduce(Value value, FlatSymbolRefAttr unit, Location loc, ArrayRef<int16_t> axes, int64_t ranks,
                  bool first) {
    auto type = cast<RankedTensorType>(value.getType());
    Averaging averaging = averagingFor(type.getElementType(), ranks, divideFactor, first, builder);
    auto start = AllReduceStartOp::create(
        builder, loc, FutureType::get(builder.getContext(), {type}), ValueRange{value}, gridRef,
        builder.getDenseI16ArrayAttr(axes),
        shard::ReductionKindAttr::get(builder.getContext(), averaging.kind),
        TypeAttr::get(type.getElementType()), averaging.preDivide, averaging.postDivide, unit);
    return WaitOp::create(builder, loc, start.getFuture()).getResult(0);
  }

  /// `<step>_no_sync`: the same step for a gradient-accumulation microbatch,
  /// whose gradients stay full and local (`unreduced`).
  void addNoSyncStep(Step &step) {
    builder.setInsertionPointAfter(step.func);
    auto clone = cast<func::FuncOp>(builder.clone(*step.func));
    clone.setSymName((step.func.getSymName() + "_no_sync").str());
    clone.walk([](GradientsOp gradients) { gradients.setUnreduced(true); });
    gatherParameters(clone);
  }

  ModuleOp module;
  Layout layout;
  OpBuilder builder;
  bool gradientAccumulation;
  double divideFactor; // 0: average
  ArrayRef<std::string> ignored;
  shard::GridOp grid;
  FlatSymbolRefAttr gridRef;
  llvm::StringMap<ParamOp> params; // sharded ones; the others (scalars, ignored ones) stay whole
  llvm::StringMap<RankedTensorType> shardTypes;
};

struct ShardParametersPass
    : public fsdp::impl::ShardParametersPassBase<ShardParametersPass> {
  using ShardParametersPassBase::ShardParametersPassBase;

  void runOnOperation() override {
    if (gradientDivideFactor < 0 || !std::isfinite(gradientDivideFactor)) {
      getOperation().emitError() << "gradient-divide-factor must be positive and finite (0: average over the "
                                    "data-parallel ranks), got "
                                 << gradientDivideFactor;
      return signalPassFailure();
    }
    FailureOr<Layout> layout =
        makeLayout(getOperation(), strategy, ranks, replicas, reshardGroup);
    if (failed(layout) ||
        failed(ParameterSharder(getOperation(), *layout, gradientAccumulation, gradientDivideFactor,
                                ignoredParams)
                   .run()))
      signalPassFailure();
  }
};

} // namespace
