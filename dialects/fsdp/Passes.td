//===- Passes.td - fsdp-opt passes --------------------------*- tablegen -*-===//
//
// The sharding pipeline, in order: fold-views, simplify-backward, shard-parameters, fuse-casts,
// activation-checkpoint, reshard-after-forward, bucket-collectives, prefetch,
// overlap-reductions, verify-schedule, plan-lifetimes; then the reports. `fsdp-sharding-pipeline` runs them all
// with one set of FSDP2-style options.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_PASSES_TD
#define FSDP_PASSES_TD

include "mlir/Pass/PassBase.td"

def FoldViewsPass : Pass<"fsdp-fold-views", "::mlir::ModuleOp"> {
  let summary = "Compose chains of views into one view, and drop views that change nothing.";
  let description = [{
    A captured backward is full of views of views: the transpose of a
    transpose, a reshape of a reshape, the `alias` autograd takes of a saved
    output. Each is a call the runtime dispatches, and a small model's step
    on a GPU is bound by its calls, not by its math. This pass rewrites, in
    program order:

    - a `view` or `_unsafe_view` of a `view`, `_unsafe_view`, `unsqueeze`
      or `squeeze` into one view of the inner view's input, and an
      `unsqueeze` or `squeeze` of a `view` into one `view` (views that only
      change the shape compose into one reshape);
    - a `permute` of a `permute` into one permute by the composed
      permutation;
    - a view that returns its input's type unchanged (an `alias`, an
      `expand`, `view` or `_unsafe_view` to the same shape, a permute by the
      identity) into its input.

    Capture is functional, so a view and its base hold the same values
    wherever they are read, and a view of a view addresses its base's memory
    with one stride per dimension, as the composed view does. The memory
    report counts views as their base's storage, so it does not change.
    An inner view that nothing else reads is dropped. The sharding pipeline
    runs this pass first, and again after `fsdp-fuse-pointwise` (its kernels
    over split halves read and return views).
  }];
}

def SimplifyBackwardPass : Pass<"fsdp-simplify-backward", "::mlir::ModuleOp"> {
  let summary = "Drop the arithmetic of autograd's formulas that changes nothing.";
  let description = [{
    Autograd's formulas, decomposed to core ATen, do full-size work that
    changes no value. This pass rewrites:

    - `pow.Tensor_Scalar(x, 1)` (the gradient of `x.pow(2)` raises x to the
      power 1) into x;
    - `add(add(g, slice_scatter(zeros, a, d, ...)), slice_scatter(zeros, b,
      d, ...))` (the gradient of two slices of one tensor, e.g. rotary
      positions' halves), where the two slices tile dimension `d` and each
      scatter and zero tensor has no other reader, into `add(g, cat([a, b],
      d))`: two full-size fills, two full-size scatters and an add become
      one concatenation.

    Both are exact (up to the sign of a zero sum). The sharding pipeline runs
    this pass after fold-views.
  }];
}

def FoldAddIntoMatmulPass : Pass<"fsdp-fold-add-into-matmul", "::mlir::ModuleOp"> {
  let summary = "Accumulate a matrix product onto the tensor added to it (one addmm instead of mm and add).";
  let description = [{
    A residual connection adds a block's output, a matrix product, to its
    input; a gradient that flows through two branches sums two products.
    Each such `add.Tensor` is a full-size kernel of its own, reading both
    tensors and writing a third. BLAS accumulates onto a tensor in its
    epilogue (beta = 1); ATen's `addmm` first copies that tensor into its
    result, two passes over memory instead of the add's three. This pass
    rewrites

    - `add(x, mm(a, b))` (either order, alpha 1), optionally through a
      `view` of the product, into `addmm(x, a, b)`, viewing x as the
      product's shape and the sum back as the add's,

    where nothing else reads the product or its view, x has the sum's
    shape and dtype (no broadcast, no promotion), eager lays x out
    row-major (`EagerStrides`), and x exists before the product: the
    `addmm` takes the product's place, so no value lives longer. The sum is
    rounded once (the product's accumulator plus x) instead of twice. The
    sharding pipeline runs this pass after simplify-backward.
  }];
}

def GroupUnitsPass : Pass<"fsdp-group-units", "::mlir::ModuleOp"> {
  let summary = "Merge consecutive wrap units into one, so their parameters travel in one bucket.";
  let description = [{
    FSDP2's `fully_shard([block0, block1])`, made from the captured units:
    each run of `size` consecutive non-root units (in declaration order)
    becomes one unit named after its members joined by `+`, listing them as
    `members`, and their parameters name it. Later passes then gather,
    free, reduce and offload the group as one: fewer, larger collectives
    (less latency and fewer launches per step) for more gathered memory at
    a time. The last group may hold fewer units. With `bucket-mib` instead
    of `size`, each group grows until its parameters (unsharded, as
    captured) hold at least that many MiB, as DDP fills buckets: small
    units merge, a unit of that size or more stays alone; the parameters
    `ignored-params` names (as `fsdp-shard-parameters` takes them) count
    for nothing, since they are never gathered. Activation
    checkpointing still names modules: the original unit names stay valid
    there.

    ```mlir
    // Before (size=2)
    fsdp.unit @"blocks.0" class "Block"
    fsdp.unit @"blocks.1" class "Block"
    fsdp.param @"blocks.1.w" : tensor<4x4xf32> unit @"blocks.1"
    // After
    fsdp.unit @"blocks.0+blocks.1" class "Block" members ["blocks.0", "blocks.1"]
    fsdp.param @"blocks.1.w" : tensor<4x4xf32> unit @"blocks.0+blocks.1"
    ```

    It runs on a captured step, before `fsdp-shard-parameters`; units that
    already list members, or a step whose collectives exist, are refused.
  }];
  let options = [
    Option<"size", "size", "int64_t", "1", "Consecutive units per group (1: unchanged)">,
    Option<"bucketMib", "bucket-mib", "double", "0",
           "Instead of size: close each group once its parameters hold this many MiB (0: by size)">,
    ListOption<"ignoredParams", "ignored-params", "std::string",
               "Parameters (FQNs or tied names) that bucket-mib does not count: never gathered">,
  ];
}

def ShardParametersPass : Pass<"fsdp-shard-parameters", "::mlir::ModuleOp"> {
  let summary = "Shard parameters along dim 0 and insert their collectives.";
  let description = [{
    Declares the device grid `@fsdp_grid`, shards every parameter along
    dim 0 over the shard group (padded to ceil(dim0/N) rows), and makes the
    step communicate: each `fsdp.get_param` now reads the local shard and is
    followed by an all-gather of it; each gradient is reduce-scattered right
    after its last producer (averaged; fp16 sums with FSDP2's pre/post
    divide). Collectives name the wrap unit of their parameter, so later
    passes can bucket per unit. A scalar parameter (a temperature, CLIP's
    `logit_scale`) has no rows to shard: it stays whole on every rank, is
    read without a gather, and its gradient is all-reduced over the whole
    grid, on every strategy. Each `fsdp.data_parallel_sum` (a sum over
    ranks the model makes, as SyncBatchNorm's) becomes a summing all-reduce
    over the whole grid and its wait, in every function.

    Strategies: `full-shard` and `shard-grad-op` shard over `ranks`
    (they differ in reshard-after-forward); `hybrid-shard` builds a
    `replicas x ranks` grid, shards within a row and all-reduces gradient
    shards across rows; `no-shard` keeps parameters whole and all-reduces
    gradients (DDP). `reshard-group g` splits the shard axis into
    `(ranks/g) x g` so that an integer reshard-after-forward can keep a
    shard over the inner `g` ranks. With `gradient-accumulation` the pass
    also writes `<step>_no_sync`, a microbatch step whose gradients stay
    local (`unreduced`), and the synchronized step adds the accumulated
    gradient before reducing.

    `gradient-divide-factor F` (FSDP2's `set_gradient_divide_factor`)
    replaces the averaging: every reduction sums and each gradient is
    divided by F once, at its first reduction (the reduce-scatter; a hybrid
    mesh's all-reduce across replicas then sums); 1 sums without dividing,
    for a loss already normalized over the whole batch (torchtitan divides
    its loss by the global token count). fp16 splits F into FSDP2's pre-
    and post-divide.

    `ignored-params` (FSDP2's `ignored_params`) names parameters, by FQN or
    tied name, that the pass leaves alone and marks `ignored`: whole on every
    rank, read without a gather, their gradients this rank's own (with
    gradient accumulation, the accumulated one added), never reduced.
  }];
  let options = [
    Option<"ranks", "ranks", "int64_t", "1", "Ranks in a shard group (N)">,
    Option<"replicas", "replicas", "int64_t", "1",
           "Replica groups for hybrid-shard (the grid is replicas x ranks)">,
    Option<"strategy", "strategy", "std::string", "\"full-shard\"",
           "full-shard | shard-grad-op | hybrid-shard | no-shard">,
    Option<"reshardGroup", "reshard-group", "int64_t", "0",
           "Inner group size for an integer reshard-after-forward (0: none)">,
    Option<"gradientAccumulation", "gradient-accumulation", "bool", "false",
           "Also emit a <step>_no_sync microbatch step without gradient communication">,
    Option<"gradientDivideFactor", "gradient-divide-factor", "double", "0",
           "Sum gradients and divide each by this factor once (0: average over the data-parallel ranks)">,
    ListOption<"ignoredParams", "ignored-params", "std::string",
               "Parameters (FQNs) left whole and local: not sharded, gathered or reduced">,
  ];
  let dependentDialects = ["::mlir::fsdp::FsdpDialect", "::mlir::shard::ShardDialect"];
}

def ActivationCheckpointPass : Pass<"fsdp-activation-checkpoint", "::mlir::ModuleOp"> {
  let summary = "Recompute wrap units' and the model's checkpoint regions' forward in backward.";
  let description = [{
    For each listed wrap unit, the forward values of the unit that backward
    uses are recomputed right before their first backward use from the
    unit's inputs, so only those inputs stay alive between forward and
    backward. Random operators are never recomputed (their results are
    saved), so dropout masks stay identical.

    The model's own checkpoint regions (`fsdp.aten ... checkpoint N`: the
    calls torch.utils.checkpoint ran, as capture marks them) are recomputed
    the same way, each region on its own, after the units (a region in a
    recomputed unit has nothing left to recompute), whether or not units
    are named: what the model asks PyTorch to recompute, fsdpc recomputes.
    A backward call marked as in a region is an error. With neither units
    nor regions the pass changes nothing.

    `policy=ops` is torchtitan's op-level selective activation
    checkpointing: within each unit and region the results of fused attention and of
    every odd matrix product in forward order (the first, third, ... of its
    `aten::mm` and `aten::addmm` calls: torchtitan's models have no biases,
    and a linear with a bias is an addmm) are saved,
    and everything else is recomputed, so the recomputation costs about
    half of the unit's matrix products' FLOPs instead of all of them.
  }];
  let options = [
    ListOption<"units", "units", "std::string",
               "Wrap units to recompute; `*` for every unit but the root">,
    Option<"policy", "policy", "std::string", "\"full\"",
           "full (recompute the unit's whole forward) | ops (save attention and every odd mm or addmm)">,
  ];
}

def SelectiveRecomputePass : Pass<"fsdp-selective-recompute", "::mlir::ModuleOp"> {
  let summary = "Recompute cheap forward ops in backward instead of saving their results.";
  let description = [{
    A forward call of one of `ops` whose result backward reads is cloned
    in backward, and backward reads the clone, when every tensor it reads
    is read by backward anyway or is itself recomputed. Calls that read each
    other's results form a chain (SwiGLU's `silu` and the `mul` after it;
    RMSNorm's two `mul`s), cloned together in program order right before
    the first backward reader of any of them. The original results then die
    in forward, so the activations saved for backward shrink. The default
    `ops` are cheap next to the matmuls around them: pointwise activations
    (`aten::gelu`, `aten::relu`, `aten::silu`, `aten::sigmoid`,
    `aten::tanh`), `aten::mul.Tensor`, `aten::native_layer_norm` and the
    fused RMSNorm of CUDA steps (`aten::_fused_rms_norm`: one kernel that
    reads its input, which its backward keeps anyway). Random operators are
    never recomputed.
  }];
  let options = [
    ListOption<"ops", "ops", "std::string",
               "ATen operators to recompute (default: cheap pointwise ops and layer and RMS norms)">,
  ];
}

def ReshardAfterForwardPass : Pass<"fsdp-reshard-after-forward", "::mlir::ModuleOp"> {
  let summary = "Free gathered parameters after forward and re-gather them in backward.";
  let description = [{
    Decides when gathered parameters are freed. Every gathered buffer is
    freed after its last use. With `mode=true` (FSDP2's default for non-root
    units) a unit's buffers are also freed after their last forward use and
    gathered again before their first backward use; `mode=false`
    (SHARD_GRAD_OP) keeps them; an integer `mode=g` keeps a dim-0 shard over
    the inner `g` ranks of the grid (see shard-parameters' reshard-group), so
    that the backward all-gather stays within that group. The root unit
    keeps its parameters unless `root` is set.
  }];
  let options = [
    Option<"mode", "mode", "std::string", "\"true\"", "true | false | <inner group size>">,
    Option<"root", "root", "bool", "false", "Reshard the root unit too">,
  ];
}

def BucketCollectivesPass : Pass<"fsdp-bucket-collectives", "::mlir::ModuleOp"> {
  let summary = "Merge adjacent collectives of one wrap unit into one bucket.";
  let description = [{
    Among the collectives of one kind, in program order, a run of adjacent
    ones with the same wrap unit, group, reduction and communication dtype
    becomes one bucketed collective: all-gathers start where the first one
    started and are waited where the first one was; reductions start and
    are waited where the last one was. Only adjacent collectives merge, so
    the sequence every rank issues stays the same on all of them.
  }];
}

def PrefetchPass : Pass<"fsdp-prefetch", "::mlir::ModuleOp"> {
  let summary = "Start all-gathers earlier so that they overlap compute.";
  let description = [{
    Moves the all-gather of the k-th wrap unit of a phase (forward or
    backward) to right after the wait of unit k-depth, as FSDP2's prefetch
    does (depth 1 is its default; 0 turns prefetching off). The memory budget
    bounds the bytes of gathered parameters alive at any point; a start that
    would exceed it is prefetched less deep. Backward's first units are not
    started early (backward begins at the loss gradient's memory peak), and
    in backward a gather still in flight is waited for before a reduction
    starts, so that two collectives never hold staging buffers at once.
  }];
  let options = [
    Option<"forwardDepth", "forward-depth", "int64_t", "1", "Units to prefetch ahead in forward">,
    Option<"backwardDepth", "backward-depth", "int64_t", "1", "Units to prefetch ahead in backward">,
    Option<"memoryBudgetMb", "memory-budget-mb", "int64_t", "0",
           "Most MiB of gathered parameters alive at once (0: no limit)">,
  ];
}

def OverlapReductionsPass : Pass<"fsdp-overlap-reductions", "::mlir::ModuleOp"> {
  let summary = "Wait for gradient reductions later so that they overlap backward.";
  let description = [{
    Moves the wait of each gradient reduction (reduce-scatter or all-reduce)
    down to the start of the reduction `depth` places later in the step, or
    to the first reader of its results if that comes first: up to `depth`
    reductions run while backward computes the next units. Depth 1 is what
    FSDP2 does (it waits for the previous reduce-scatter before issuing the
    next); 0 waits for each reduction right after it starts. Starts do not
    move, so the collective sequence is unchanged. A reduction's staging
    buffers live until its wait, which the memory report counts.
  }];
  let options = [
    Option<"depth", "depth", "int64_t", "1", "Reductions in flight while backward computes (0: none)">,
  ];
}

def GatherIntoResultsPass : Pass<"fsdp-gather-into-results", "::mlir::ModuleOp"> {
  let summary = "All-gathers write their results directly: no receive buffer, no copy-out.";
  let description = [{
    Marks each all-gather `into_results`: the start allocates each
    parameter's padded full tensor and casts this rank's shard into its
    place there, and the collective (on NCCL, one in-place all-gather per
    parameter of the bucket, coalesced into one launch) fills in the other
    ranks' shards. That saves the receive buffer and the copy-out kernel,
    which reads and writes every gathered byte once more (on the
    70B step at 8 GPUs, 6% of the predicted step); the results live from the
    start instead of the wait, in the receive buffer's place, and the moment
    both existed at the wait is gone; after the wait each result holds its
    padding rows (fewer than N) as well. An offloaded unit's all-gather is left as it is. For NCCL only: Gloo would still receive into a buffer (it gathers by
    all-reducing one), and then hold the results beside it; a runtime that
    meets such an all-gather on Gloo copies into the results at the wait.
  }];
  let options = [
    Option<"backend", "backend", "std::string", "\"nccl\"", "Collective library the runtime uses: nccl (gloo is refused)">,
  ];
}

def FuseCastsPass : Pass<"fsdp-fuse-casts", "::mlir::ModuleOp"> {
  let summary = "Fuse dtype casts into collectives' copy-in.";
  let description = [{
    A gathered parameter whose every use casts it to one dtype is gathered
    in that dtype instead: the cast moves into the all-gather's copy-in and
    the wire carries half the bytes for bf16. A gradient that is only cast
    to feed a reduction enters the reduction uncast: the reduce-scatter's
    copy-in converts it to `reduce_dtype`. The reduce dtype comes from the
    option, else the module's `fsdp.mixed_precision` (`reduce_dtype`, else
    `param_dtype`), else stays. An f16 reduction averages by pre/post
    division.
  }];
  let options = [
    Option<"reduceDtype", "reduce-dtype", "std::string", "\"\"", "f32 | bf16 | f16 (default: see above)">,
  ];
}

def OffloadUnitsPass : Pass<"fsdp-offload-units", "::mlir::ModuleOp"> {
  let summary = "Keep wrap units' shards, gradients and optimizer state in host memory.";
  let description = [{
    FSDP2's `CPUOffloadPolicy`, per wrap unit. Marks the chosen units
    `offloaded`, their all-gathers that read shards `host` (the copy-in moves
    the shards to the device) and the reductions that hand their gradients
    to `fsdp.gradients` `host` (the wait delivers them to host memory). The
    optimizer then steps those parameters where their state is, on the host.
    Nothing moves: the schedule, its lifetimes and the collective sequence
    are unchanged, so prefetch already issues each host copy one unit early.

    `units` names the units, `*` every unit. Only sharded parameters are
    offloaded: a unit with a replicated (no-shard) parameter is refused (an
    ignored parameter stays on the device and does not count).

    `fit-bytes` offloads only what does not fit (the pipeline's
    `offload-to-fit` gives MiB): as long as a step's device peak (the memory
    report's model, for `optimizer` and `backend`) exceeds the budget, one
    more unit is offloaded, the smallest whose state
    covers the excess, else the largest; of units the same size, the one
    the forward gathers last (its gradients land first in backward, and the
    next forward starts on units the host does not update). Every byte left on the device
    spares a host copy and host optimizer work. A budget that even full
    offload cannot meet is an error that says by how much. On a CPU target
    host memory is the device's, so there is nothing to fit.
  }];
  let options = [
    ListOption<"units", "units", "std::string", "Wrap units to offload (* for all)">,
    Option<"fitBytes", "fit-bytes", "int64_t", "0",
           "Offload the fewest units that bring the device peak within this many bytes (0: off)">,
    Option<"optimizer", "optimizer", "std::string", "\"adamw\"", "adamw | adam | sgd-momentum | sgd | none">,
    Option<"backend", "backend", "std::string", "\"gloo\"", "gloo | nccl (the memory model's staging)">,
  ];
}

def CudaGraphPass : Pass<"fsdp-cuda-graph", "::mlir::ModuleOp"> {
  let summary = "Replay CUDA steps as CUDA graphs: one launch instead of one per instruction.";
  let description = [{
    Marks each step function (a function with an `fsdp.loss`) of a CUDA
    step `fsdp.cuda_graph`. The runtime runs such a function's first call
    as instructions (NCCL's communicators, cuBLAS's workspaces and the
    kernels are set up outside any capture), captures the second into a
    CUDA graph on a stream of its own, and replays the graph from then on:
    the host issues one launch and two copies (the batch into the graph's
    inputs) instead of one call per instruction. Where the host bounds the
    step (a small model on a fast GPU), that is most of the step.

    What a replay keeps from eager execution: the parameters, buffers and
    process groups are the ones captured, checked by address before every
    replay (a changed one is captured anew); the loss and gradients a call
    returns read the graph's memory, and any of them still held when the
    next call replays (a loss kept in a list, gradients accumulated over
    calls without `zero_grad`) is first moved to memory of its own, so it
    keeps its value. The step's working memory (its peak above the step's
    start, the memory report's number) stays reserved for the graph between
    calls; a call on a batch of another shape lets the last shape's graph
    and memory go (each change of shape captures anew). A capture that
    fails where every group has one rank runs the step as instructions from
    then on, with a warning that says why; elsewhere the call fails.

    A function that reads accumulated gradients (`fsdp.get_accumulated_grad`:
    the synchronizing step of a program compiled for gradient accumulation)
    is not marked: what it reads is new on every call. Refused, with the
    reason: a step captured for the CPU; gloo collectives (they run on the
    host); offloaded units (their host copies and host optimizer run beside
    the step on host threads).

    Before: `func.func @step(...)`. After: `func.func @step(...)
    attributes {fsdp.cuda_graph}`.
  }];
  let options = [
    Option<"backend", "backend", "std::string", "\"nccl\"", "nccl | gloo (refused: gloo's collectives run on the host)">,
  ];
}

def VerifySchedulePass : Pass<"fsdp-verify-schedule", "::mlir::ModuleOp"> {
  let summary = "Check the collective schedule and hash it.";
  let description = [{
    Checks what the op verifiers cannot see: collectives sit in the straight-
    line body of a step (never under control flow, where ranks could take
    different paths), and every gathered buffer is freed. Then it records a
    canonical hash of the step's collective sequence (kind, group, dtypes,
    shapes, reduction) as `fsdp.collective_hash`, with the count as
    `fsdp.collective_count`: a fingerprint for comparing schedules between
    compilations. Only a verified step lowers to a program. Ranks need no
    hash comparison at run time: every rank runs the one program rank 0
    compiled, and ranks that set up a different step are refused before
    anything is compiled.
  }];
}

def FusePointwisePass : Pass<"fsdp-fuse-pointwise", "::mlir::ModuleOp"> {
  let summary = "Run chains of elementwise ATen calls as one generated kernel each (CUDA steps).";
  let description = [{
    On a GPU every elementwise call is a kernel launch that reads its
    inputs from memory and writes a full-size result: RMSNorm's tail,
    SwiGLU's `silu(a) * b` and their backward formulas are half a dozen
    launches and tensors each. This pass groups such calls into
    `fsdp.pointwise` ops, each one kernel that computes every output element
    in registers and writes only what is read later.

    Calls join a group in program order. A call that reads a value of a
    group joins it when the group's calls can all move down to the call's
    place (nothing outside the group reads their results, or frees their
    operands, in between), the group stays within 8 inputs and 8 outputs,
    every value read after the group has the group's full shape, and the
    kernel's outputs get the strides eager's calls would have
    given them (the kernel's TensorIterator orders dimensions by its
    inputs' strides, eager's last call by its own; a later `view` relies on
    the result's strides), which `fsdp/Analysis/Strides.h` computes from
    ATen's rules; inputs may be strided views (a permuted or sliced query,
    a broadcast table). A call whose other operands exist at the group's
    place may move up to it instead (at most 16 ops). A call that joins no
    group of its operands joins a group that reads one of its operands too
    (a sibling: SwiGLU's two input gradients both read its product's
    gradient) by moving up to it: one kernel reads the shared tensor once
    and hands out both results. Once the kernels are formed, a kernel that
    reads another kernel's result computed only from tensors it reads too
    computes that result inside instead (SwiGLU's gradient kernel reads
    gate, so it recomputes silu(gate) rather than read the forward kernel's
    copy, which then writes only the product): a tensor fewer read, and one
    fewer written where nothing else reads it.

    No move may raise the step's peak. A kernel holds the operands of all
    its calls until it runs and its results from where it runs, so a call
    moved down keeps its operands alive longer, and one moved up its
    result. The pass follows the bytes live after each call (the memory
    model's walk, with values freed where `fsdp-plan-lifetimes` will free
    them, NCCL's staging) as groups form and refuses a move that would take
    them above the most they were before fusion anywhere in the step.

    Half slices and concatenations of halves join too (`x[..., :h]`,
    `x[..., h:]`, `cat([a, b], -1)`: the rotary embeddings' `rotate_half`
    and its backward). Such a kernel runs over the split dimension as
    `[2, h]`: it reads a whole input as a view split so, a half of one as a
    slice of that view (made once per function, where the input is made),
    computes a half of a value inside from halves of its operands, makes a
    concatenation a choice (`aten::where.self`) by which half an element is
    in (a `[2, 1]` bool tensor made once per function), and views its
    results back; eager's layout is checked on that. While such a group
    grows it may hand out halves, or a layout the next call changes; it
    becomes a kernel only where neither remains. Which calls
    qualify, and how each computes an element, is one table
    (`fsdp/Dialect/Pointwise.h`). A group of one call stays a call.

    Only steps captured for CUDA (`fsdp.device = "cuda"` on the module) are
    rewritten; on a CPU step the pass changes nothing. The sharding
    pipeline runs it, then `fsdp-fold-views`, before `fsdp-plan-lifetimes`
    (`fuse-pointwise=false` turns both off), so lifetimes and the memory
    report see the fused ops.
  }];
  let dependentDialects = ["::mlir::fsdp::FsdpDialect"];
}

def TestEagerStridesPass : Pass<"fsdp-test-eager-strides", "::mlir::ModuleOp"> {
  let summary = "Annotate every tensor result with the strides eager PyTorch gives it (for tests).";
  let description = [{
    Writes what `fsdp-fuse-pointwise` assumes about layouts where a test can
    hold it against ATen: each op with tensor results gets
    `test.eager_strides`, one entry per result, the strides in elements
    (`array<i64: ...>`) or `unit` where no rule says. Changes nothing else.
  }];
}

def TestLiveBytesPass : Pass<"fsdp-test-live-bytes", "::mlir::ModuleOp"> {
  let summary = "Annotate each step with the bytes the memory model has live after each op (for tests).";
  let description = [{
    Writes the memory model's walk where a test can compare its two rules:
    each step function gets `test.live_after`, the bytes the step has
    allocated and not freed after each op that is not an `fsdp.release`
    (`array<i64: ...>`, in program order), and `test.live_peak`. With
    `frees=releases` storage is freed at the releases and reshards the step
    holds (the runtime's rule); with `frees=last-use` where
    `fsdp-plan-lifetimes` would release it (what `fsdp-fuse-pointwise`
    plans by, before lifetimes exist). On a step with its releases stripped
    the second must equal the first on the step as planned. Changes
    nothing else.
  }];
  let options = [
    Option<"frees", "frees", "std::string", "\"releases\"", "releases | last-use">,
    Option<"backend", "backend", "std::string", "\"nccl\"", "gloo | nccl (the staging rules)">,
  ];
}

def PlanLifetimesPass : Pass<"fsdp-plan-lifetimes", "::mlir::ModuleOp"> {
  let summary = "Release every value right after its last use.";
  let description = [{
    Makes every lifetime of a step explicit: after the last use of each
    tensor value (or right after its definition when nothing reads it) an
    `fsdp.release` lists it. Gathered buffers keep their `fsdp.reshard`;
    values a function returns are not released. The runtime drops values at
    these releases and the memory report frees them at the same points, so
    the report predicts what the runtime does. Runs last in the pipeline,
    after the schedule is fixed; running it again changes nothing.
  }];
  let dependentDialects = ["::mlir::fsdp::FsdpDialect"];
}

def MemoryReportPass : Pass<"fsdp-memory-report", "::mlir::ModuleOp"> {
  let summary = "Per-rank memory: static state, peak, and its timeline.";
  let description = [{
    Computes, per step function and rank: sharded parameters, gradients,
    optimizer state for `optimizer`, buffers, and a walk of the schedule
    under the runtime's own rules: collective staging buffers from start to
    wait, gathered parameters from the wait to their `fsdp.reshard`,
    computed values from their op to the `fsdp.release` of their last alias
    (views share storage; see `fsdp-plan-lifetimes`), gradient shards from
    their reduction to the end. It gives the peak above the step's start
    (what an allocator measures during the step), where it happens and what
    is alive then, and the activations saved for backward. Records
    `fsdp.memory` on the function and writes a table or JSON.
  }];
  let options = [
    Option<"optimizer", "optimizer", "std::string", "\"adamw\"", "adamw | adam | sgd-momentum | sgd | none">,
    Option<"format", "format", "std::string", "\"table\"", "table | json">,
    Option<"output", "output", "std::string", "\"-\"", "Report file; - for stdout">,
    Option<"backend", "backend", "std::string", "\"gloo\"",
           "Collective library the runtime uses, which sets its staging buffers: gloo (CPU) | nccl (GPU)">,
  ];
}

def CommReportPass : Pass<"fsdp-comm-report", "::mlir::ModuleOp"> {
  let summary = "Per-rank communication volume per step, by collective kind.";
  let description = [{
    Bytes each rank sends per step as the collectives run on `backend`
    (ring algorithms), in the dtype on the wire, padding included. On NCCL:
    (n-1)/n of the gathered or reduced tensors for all-gather and
    reduce-scatter, 2(n-1)/n for all-reduce. On Gloo the runtime runs
    all-gathers and reduce-scatters as in-place all-reduces of the padded
    buffer (no temporaries), so every collective sends 2(n-1)/n of it.
    Records `fsdp.comm` on the function and writes a table or JSON; a test
    compares it with the bytes the runtime hands to each backend.
  }];
  let options = [
    Option<"format", "format", "std::string", "\"table\"", "table | json">,
    Option<"output", "output", "std::string", "\"-\"", "Report file; - for stdout">,
    Option<"backend", "backend", "std::string", "\"gloo\"",
           "Collective library the step runs on: gloo (CPU) or nccl">,
  ];
}

def StepTimePass : Pass<"fsdp-step-time", "::mlir::ModuleOp"> {
  let summary = "Predicted time of one rank's step on a GPU, and its trace.";
  let description = [{
    Replays the compiled schedule in program order on a model of a GPU
    (`gpu`: h100-sxm, h100-96gb, h200, a100-80gb, or custom with every
    hardware number given): a host thread issues each instruction in
    `issue-us`; compute kernels take their roofline time (FLOPs of matrix
    products, convolutions and fused attention over the peak times an
    efficiency, bytes read and written over the memory bandwidth times an
    efficiency, at least `shortest-kernel-us`; generated kernels stream
    like any other, their loops vectorized over broadcast inputs too);
    collectives run on one
    stream per communication group, as NCCL keeps one per communicator,
    after their copy-in, and take a ring's time over the link their group
    crosses (NVLink inside a node of `gpus-per-node` GPUs, the network
    across); a wait holds the compute stream until its collective ends;
    offloaded units' copies run over the host link on two streams, one
    each way;
    the optimizer steps after the schedule, on the device or the host; with
    `overlap-host-optimizer` the host steps offloaded units during the next
    step instead, from its start, in the order of their gathers, and the
    host waits at each unit's gather for its update; with
    `host-optimizer-in-backward` it steps each unit from when its gradients
    land in host memory (their copy off the device ends), whenever free the
    landed unit gathered first, and the next step inherits what is left
    (the steady state: the step is replayed until that settles).

    Writes, per step function, the step time split into compute, exposed
    communication (compute waiting for a collective), host-bound time
    (compute waiting for the host) and the optimizer, with FLOPs with and
    without recomputation (`fsdp.recomputed`) and the machine's numbers, as
    a table or JSON; `trace` writes the predicted step as a Chrome trace /
    Perfetto JSON (one track per stream). Any number given overrides the
    kind's; 0 keeps it.
  }];
  let options = [
    Option<"gpu", "gpu", "std::string", "\"h100-sxm\"", "h100-sxm | h100-96gb | h200 | a100-80gb | custom">,
    Option<"optimizer", "optimizer", "std::string", "\"adamw\"", "adamw | adam | sgd-momentum | sgd | none">,
    Option<"format", "format", "std::string", "\"table\"", "table | json">,
    Option<"output", "output", "std::string", "\"-\"", "Report file; - for stdout, empty for none">,
    Option<"trace", "trace", "std::string", "\"\"", "Trace file of the predicted step (empty: none)">,
    Option<"gpusPerNode", "gpus-per-node", "int64_t", "8", "GPUs that share a node's NVLink domain">,
    Option<"overlapHostOptimizer", "overlap-host-optimizer", "bool", "false",
           "Offloaded units' optimizer steps run beside the next step's forward">,
    Option<"hostOptimizerInBackward", "host-optimizer-in-backward", "bool", "false",
           "Offloaded units' optimizer steps start as their gradients land, during backward">,
    Option<"memoryGib", "memory-gib", "double", "0", "GPU memory (GiB)">,
    Option<"tensorTflops", "tensor-tflops", "double", "0", "Dense bf16/f16 peak (TFLOP/s)">,
    Option<"fp32Tflops", "fp32-tflops", "double", "0", "fp32 matmul peak (TFLOP/s)">,
    Option<"memoryGbps", "memory-gbps", "double", "0", "GPU memory bandwidth (GB/s)">,
    Option<"intraNodeGbps", "intra-node-gbps", "double", "0", "Collective bus bandwidth inside a node (GB/s)">,
    Option<"interNodeGbps", "inter-node-gbps", "double", "0", "Collective bus bandwidth per GPU across nodes (GB/s)">,
    Option<"hostLinkGbps", "host-link-gbps", "double", "0", "Pinned host <-> device copy bandwidth (GB/s)">,
    Option<"hostOptimizerGbps", "host-optimizer-gbps", "double", "0", "Bytes an optimizer streams on the host (GB/s)">,
    Option<"matmulEfficiency", "matmul-efficiency", "double", "0", "Share of the peak matrix products reach">,
    Option<"attentionEfficiency", "attention-efficiency", "double", "0", "Share of the peak fused attention reaches">,
    Option<"memoryEfficiency", "memory-efficiency", "double", "0", "Share of the memory bandwidth other kernels reach">,
    Option<"collectiveLatencyUs", "collective-latency-us", "double", "-1", "Latency of one collective (us; -1 keeps it)">,
    Option<"issueUs", "issue-us", "double", "-1", "Host time to issue one instruction (us; -1 keeps it)">,
    Option<"shortestKernelUs", "shortest-kernel-us", "double", "-1", "Shortest kernel (us; -1 keeps it)">,
  ];
}

#endif // FSDP_PASSES_TD
