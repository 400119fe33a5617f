//===- ShardingPipeline.cpp - every sharding pass, one set of options -----===//
//
// `fsdp-sharding-pipeline` takes FSDP2's knobs and runs, in order:
// fold-views, simplify-backward, group-units (if units-per-group is not 1
// or unit-bucket-mib is given), shard-parameters, fuse-casts,
// activation-checkpoint (named units and the model's own checkpoint
// regions), selective-recompute,
// reshard-after-forward, bucket-collectives, prefetch, overlap-reductions,
// verify-schedule, fuse-pointwise and fold-views again (CUDA steps, unless
// fuse-pointwise=false), plan-lifetimes, offload-units (if units are named),
// gather-into-results (on NCCL, unless gather-into-results=false), and the
// reports that were asked for.
//
//   fsdp-opt gpt.mlir --fsdp-sharding-pipeline="ranks=8 strategy=full-shard
//       forward-prefetch=1 memory-report=mem.json report-format=json"
//
// Test: test/Transforms/sharding-pipeline.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Where all-gathers write: `Default` is the library's better one, into
/// the results on NCCL (2.6 of 140.9 ms on the 0.9B Llama on an H100,
/// benchmarks/gpu-results.md 2026-11-25), a receive buffer on Gloo.
enum class GatherInto { Default, Results, Buffer };

struct ShardingPipelineOptions : public PassPipelineOptions<ShardingPipelineOptions> {
  Option<int64_t> ranks{*this, "ranks", llvm::cl::desc("Ranks in a shard group (N)"),
                        llvm::cl::init(1)};
  Option<int64_t> replicas{*this, "replicas",
                           llvm::cl::desc("Replica groups (hybrid-shard)"), llvm::cl::init(1)};
  Option<std::string> strategy{
      *this, "strategy",
      llvm::cl::desc("full-shard | shard-grad-op | hybrid-shard | no-shard"),
      llvm::cl::init("full-shard")};
  Option<int64_t> unitsPerGroup{
      *this, "units-per-group",
      llvm::cl::desc("Consecutive wrap units merged into one (FSDP2's fully_shard of a list): one bucket each"),
      llvm::cl::init(1)};
  Option<double> unitBucketMib{
      *this, "unit-bucket-mib",
      llvm::cl::desc("Instead of units-per-group: merge consecutive wrap units until each group's "
                     "parameters hold this many MiB"),
      llvm::cl::init(0)};
  Option<std::string> reshardAfterForward{
      *this, "reshard-after-forward",
      llvm::cl::desc("default (true, false for shard-grad-op) | true | false | <inner group size>"),
      llvm::cl::init("default")};
  Option<bool> reshardRoot{*this, "reshard-root", llvm::cl::desc("Reshard the root unit too"),
                           llvm::cl::init(false)};
  Option<int64_t> forwardPrefetch{*this, "forward-prefetch",
                                  llvm::cl::desc("Units to prefetch ahead in forward"),
                                  llvm::cl::init(1)};
  Option<int64_t> backwardPrefetch{*this, "backward-prefetch",
                                   llvm::cl::desc("Units to prefetch ahead in backward"),
                                   llvm::cl::init(1)};
  Option<int64_t> overlapReductions{
      *this, "overlap-reductions",
      llvm::cl::desc("Gradient reductions in flight while backward computes (0: wait at once)"),
      llvm::cl::init(1)};
  Option<int64_t> memoryBudgetMb{*this, "memory-budget-mb",
                                 llvm::cl::desc("Most MiB of gathered parameters alive (0: no limit)"),
                                 llvm::cl::init(0)};
  Option<double> gradientDivideFactor{
      *this, "gradient-divide-factor",
      llvm::cl::desc("Sum gradients and divide each by this factor once (0: average over the data-parallel "
                     "ranks; 1: sum, for a loss normalized over the whole batch)"),
      llvm::cl::init(0)};
  ListOption<std::string> ignoredParams{
      *this, "ignored-params",
      llvm::cl::desc("Parameters (FQNs) left whole and local on every rank: not sharded, gathered or reduced "
                     "(FSDP2's ignored_params)")};
  Option<std::string> reduceDtype{*this, "reduce-dtype",
                                  llvm::cl::desc("f32 | bf16 | f16 (default: the module's mixed precision)"),
                                  llvm::cl::init("")};
  ListOption<std::string> checkpoint{*this, "checkpoint",
                                     llvm::cl::desc("Wrap units to recompute in backward (* for all)")};
  Option<std::string> checkpointPolicy{
      *this, "checkpoint-policy",
      llvm::cl::desc("full | ops (torchtitan's op-level selective checkpointing: save attention and every "
                     "odd mm or addmm)"),
      llvm::cl::init("full")};
  Option<bool> selectiveRecompute{
      *this, "selective-recompute",
      llvm::cl::desc("Recompute cheap ops (activations, layer norm) in backward instead of saving them"),
      llvm::cl::init(true)};
  ListOption<std::string> offload{*this, "offload",
                                  llvm::cl::desc("Wrap units whose shards, gradients and optimizer state "
                                                 "stay in host memory (* for all)")};
  Option<int64_t> offloadToFit{*this, "offload-to-fit",
                               llvm::cl::desc("Offload the fewest units that bring the device peak "
                                              "within this many MiB (0: off)"),
                               llvm::cl::init(0)};
  Option<bool> gradientAccumulation{*this, "gradient-accumulation",
                                    llvm::cl::desc("Also emit <step>_no_sync microbatch steps"),
                                    llvm::cl::init(false)};
  Option<std::string> optimizer{*this, "optimizer",
                                llvm::cl::desc("Optimizer for the memory report"),
                                llvm::cl::init("adamw")};
  Option<std::string> memoryReport{*this, "memory-report",
                                   llvm::cl::desc("Write the memory report here (- for stdout)"),
                                   llvm::cl::init("")};
  Option<std::string> commReport{*this, "comm-report",
                                 llvm::cl::desc("Write the communication report here (- for stdout)"),
                                 llvm::cl::init("")};
  Option<std::string> backend{*this, "backend",
                              llvm::cl::desc("Collective library the runtime uses (memory and communication reports): gloo | nccl"),
                              llvm::cl::init("gloo")};
  Option<std::string> reportFormat{*this, "report-format", llvm::cl::desc("table | json"),
                                   llvm::cl::init("table")};
  Option<GatherInto> gatherIntoResults{
      *this, "gather-into-results",
      llvm::cl::desc("All-gathers write the parameters directly, without a receive buffer and a copy-out: "
                     "default (true on nccl, false on gloo) | true | false"),
      llvm::cl::init(GatherInto::Default),
      llvm::cl::values(clEnumValN(GatherInto::Default, "default", "true on nccl, false on gloo"),
                       clEnumValN(GatherInto::Results, "true", "into the results (nccl only)"),
                       clEnumValN(GatherInto::Buffer, "false", "into a receive buffer, then copied out"))};
  Option<bool> fusePointwise{
      *this, "fuse-pointwise",
      llvm::cl::desc("On a CUDA step, run chains of elementwise calls as one generated kernel each"),
      llvm::cl::init(true)};
  Option<bool> cudaGraph{
      *this, "cuda-graph",
      llvm::cl::desc("On a CUDA step, capture each step once and replay it as a CUDA graph (fsdp-cuda-graph)"),
      llvm::cl::init(false)};
  Option<std::string> trace{*this, "trace", llvm::cl::desc("Write the predicted step on an H100 (fsdp-step-time) as a Chrome trace here"),
                            llvm::cl::init("")};
};

void buildShardingPipeline(OpPassManager &pm, const ShardingPipelineOptions &options) {
  std::string mode = options.reshardAfterForward;
  if (mode == "default")
    mode = options.strategy == "shard-grad-op" ? "false" : "true";
  int64_t innerGroup = 0;
  if (mode != "true" && mode != "false")
    (void)StringRef(mode).getAsInteger(10, innerGroup); // the pass reports a bad value

  pm.addPass(createFoldViewsPass());
  pm.addPass(createSimplifyBackwardPass());
  pm.addPass(createFoldAddIntoMatmulPass());
  if (options.unitsPerGroup != 1 || options.unitBucketMib != 0) {
    GroupUnitsPassOptions group;
    group.size = options.unitsPerGroup;
    group.bucketMib = options.unitBucketMib;
    group.ignoredParams = llvm::to_vector(options.ignoredParams);
    pm.addPass(createGroupUnitsPass(group));
  }
  ShardParametersPassOptions shard;
  shard.ranks = options.ranks;
  shard.replicas = options.replicas;
  shard.strategy = options.strategy;
  shard.reshardGroup = innerGroup;
  shard.gradientAccumulation = options.gradientAccumulation;
  shard.gradientDivideFactor = options.gradientDivideFactor;
  shard.ignoredParams = llvm::to_vector(options.ignoredParams);
  pm.addPass(createShardParametersPass(shard));
  // Casts fuse first, so that the later passes see each gathered buffer
  // with all of its readers (a cast's result read in backward is the buffer).
  FuseCastsPassOptions casts;
  casts.reduceDtype = options.reduceDtype;
  pm.addPass(createFuseCastsPass(casts));
  // The named units and the model's own checkpoint regions (nothing where
  // there are neither).
  ActivationCheckpointPassOptions recompute;
  recompute.units = llvm::to_vector(options.checkpoint);
  recompute.policy = options.checkpointPolicy;
  pm.addPass(createActivationCheckpointPass(recompute));
  if (options.selectiveRecompute)
    pm.addPass(createSelectiveRecomputePass());
  ReshardAfterForwardPassOptions reshard;
  reshard.mode = mode;
  reshard.root = options.reshardRoot;
  pm.addPass(createReshardAfterForwardPass(reshard));
  pm.addPass(createBucketCollectivesPass());
  PrefetchPassOptions prefetch;
  prefetch.forwardDepth = options.forwardPrefetch;
  prefetch.backwardDepth = options.backwardPrefetch;
  prefetch.memoryBudgetMb = options.memoryBudgetMb;
  pm.addPass(createPrefetchPass(prefetch));
  OverlapReductionsPassOptions overlap;
  overlap.depth = options.overlapReductions;
  pm.addPass(createOverlapReductionsPass(overlap));
  pm.addPass(createVerifySchedulePass());
  if (options.fusePointwise) {
    pm.addPass(createFusePointwisePass());
    pm.addPass(createFoldViewsPass()); // the kernels' split views against the views around them
  }
  pm.addPass(createPlanLifetimesPass());
  if (!options.offload.empty() || options.offloadToFit > 0) {
    OffloadUnitsPassOptions offload;
    offload.units = llvm::to_vector(options.offload);
    offload.fitBytes = options.offloadToFit * 1048576;
    offload.optimizer = options.optimizer;
    offload.backend = options.backend;
    pm.addPass(createOffloadUnitsPass(offload));
  }
  bool gatherIntoResults = options.gatherIntoResults == GatherInto::Default
                               ? options.backend == "nccl"
                               : options.gatherIntoResults == GatherInto::Results;
  if (gatherIntoResults) {
    GatherIntoResultsPassOptions into;
    into.backend = options.backend;
    pm.addPass(createGatherIntoResultsPass(into));
  }
  if (options.cudaGraph) {
    CudaGraphPassOptions graph;
    graph.backend = options.backend;
    pm.addPass(createCudaGraphPass(graph));
  }
  if (!options.memoryReport.empty()) {
    MemoryReportPassOptions memory;
    memory.optimizer = options.optimizer;
    memory.format = options.reportFormat;
    memory.output = options.memoryReport;
    memory.backend = options.backend;
    pm.addPass(createMemoryReportPass(memory));
  }
  if (!options.commReport.empty()) {
    CommReportPassOptions comm;
    comm.format = options.reportFormat;
    comm.output = options.commReport;
    comm.backend = options.backend;
    pm.addPass(createCommReportPass(comm));
  }
  if (!options.trace.empty()) {
    StepTimePassOptions time;
    time.output = "";
    time.trace = options.trace;
    time.optimizer = options.optimizer;
    pm.addPass(createStepTimePass(time));
  }
}

} // namespace

void mlir::fsdp::registerShardingPipeline() {
  PassPipelineRegistration<ShardingPipelineOptions>(
      "fsdp-sharding-pipeline",
      "Shard a captured step FSDP-style: every sharding pass with FSDP2's options",
      buildShardingPipeline);
}
