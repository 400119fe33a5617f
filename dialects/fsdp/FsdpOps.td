//===- FsdpOps.td - fsdp dialect operations ----------------*- tablegen -*-===//
//
// The descriptions below are the dialect's manual (docs/dialect/FsdpDialect.md
// is generated from them).
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_OPS_TD
#define FSDP_OPS_TD

include "fsdp/FsdpDialect.td"
include "mlir/Dialect/Shard/IR/ShardBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

/// Step-body ops live inside a function, never directly in the module.
def Fsdp_InFunction : NativeOpTrait<"InFunction"> {
  let cppNamespace = "::mlir::fsdp";
}

def Fsdp_StaticTensor : Type<And<[AnyRankedTensor.predicate, HasStaticShapePred]>,
                             "statically shaped tensor", "::mlir::RankedTensorType">;

//===----------------------------------------------------------------------===//
// Module structure: wrap units and parameters
//===----------------------------------------------------------------------===//

def Fsdp_UnitOp : Fsdp_Op<"unit", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "A wrap unit: one FSDP communication group.";
  let description = [{
    Declares a wrap unit, the analogue of one `fully_shard` call in PyTorch
    FSDP2: the parameters that name this unit are gathered together and their
    gradients reduced together. Units are chosen bottom-up at capture time
    (by module class or predicate; by default each transformer block).

    Exactly one unit may carry `root`: it owns every parameter not owned by a
    nested unit, and FSDP2 keeps it unsharded after forward by default.
    `class` records the PyTorch module class the unit was made from.

    `members` lists the modules a unit wraps when it is more than the one
    its name says, like FSDP2's `fully_shard([block0, block1])`:
    `fsdp-group-units` makes such units from consecutive ones, so that
    their parameters travel in one bucket. A unit without `members` wraps
    the module its name is the path of.

    `offloaded` (FSDP2's `CPUOffloadPolicy`, set by `fsdp-offload-units`)
    keeps the unit's parameter shards, their gradients and so their
    optimizer state in host memory: its all-gathers read the shards from the
    host and its gradient reductions deliver to the host (`host` on those
    collectives), and the optimizer steps them where they are. On a CPU
    target host memory is the device's, so only the memory report's split
    changes.

    ```mlir
    fsdp.unit @root root
    fsdp.unit @"layers.0" class "Block"
    fsdp.unit @"layers.1" class "Block" offloaded
    fsdp.unit @"layers.2+layers.3" class "Block" members ["layers.2", "layers.3"]
    ```

    Rules: at most one root unit per module; the root has no `members`;
    `members` are distinct, non-empty module paths and no module is a
    member of two units; the parameters of an
    `offloaded` unit are sharded, each read only by `host` all-gathers, and
    each trainable one's synchronized gradient comes from a `host` reduction.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, UnitAttr:$root,
                       OptionalAttr<StrAttr>:$module_class, OptionalAttr<StrArrayAttr>:$members,
                       UnitAttr:$offloaded);
  let assemblyFormat = [{
    $sym_name (`root` $root^)? (`class` $module_class^)? (`members` $members^)? (`offloaded` $offloaded^)?
    attr-dict
  }];
  let extraClassDeclaration = [{
    /// The module paths this unit wraps: its `members`, or its own name.
    ::llvm::SmallVector<::llvm::StringRef> getModulePaths();
  }];
  let hasVerifier = 1;
}

def Fsdp_ParamOp : Fsdp_Op<"param", [
    Symbol, HasParent<"::mlir::ModuleOp">,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "A named model parameter, and how it is sharded.";
  let description = [{
    Declares a model parameter by its PyTorch fully qualified name (FQN), with
    its logical (unsharded, unpadded) type and the wrap unit that owns it.
    `frozen` marks parameters with `requires_grad=False`: they are gathered
    but never receive gradients. `tied` lists the other FQNs under which the
    model registers the same tensor (e.g. an output projection sharing the
    input embedding): one parameter, gathered once, with one gradient.
    `ignored` marks a parameter FSDP leaves alone (FSDP2's `ignored_params`):
    every rank keeps its own whole copy, reads it without a gather, and keeps
    its own gradient: nothing about it is communicated, and it stays on the
    device when its unit is offloaded.

    Once sharded, the parameter is split along dim 0 over the ranks of the
    grid axes listed after `sharded on`. Every rank stores ceil(dim0 / N) rows
    (N = product of those axes' sizes); `padding` is the number of zero rows
    this adds over the whole group, N * ceil(dim0 / N) - dim0. Grid axes not
    listed replicate the parameter (hybrid sharding). A parameter without
    `sharded` is replicated on every rank (NO_SHARD).

    ```mlir
    shard.grid @dp(shape = 4)
    fsdp.unit @root root
    fsdp.param @"tok_emb.weight" : tensor<50257x768xf32> unit @root
    fsdp.param @"lm_head.bias" : tensor<10xf32> unit @root frozen
        sharded on @dp axes = [0] padding = 2
    ```

    Rules: the type is statically shaped; the unit names an `fsdp.unit`;
    `tied` names are non-empty, distinct, differ from the parameter's own
    name and name no other parameter;
    `sharded on`, `axes` and `padding` come together; a sharded parameter has
    rank >= 1; an `ignored` parameter is not sharded; the grid names a `shard.grid`, the axes are distinct, in range
    and of static size; `padding` equals N * ceil(dim0 / N) - dim0.
  }];
  let arguments = (ins
    SymbolNameAttr:$sym_name,
    TypeAttrOf<Fsdp_StaticTensor>:$type,
    FlatSymbolRefAttr:$unit,
    UnitAttr:$frozen,
    UnitAttr:$ignored,
    OptionalAttr<StrArrayAttr>:$aliases,
    OptionalAttr<FlatSymbolRefAttr>:$grid,
    OptionalAttr<Shard_GridAxesAttr>:$grid_axes,
    OptionalAttr<I64Attr>:$padding);
  let assemblyFormat = [{
    $sym_name `:` $type `unit` $unit (`frozen` $frozen^)? (`ignored` $ignored^)? (`tied` $aliases^)?
    (`sharded` `on` $grid^ `axes` `=` $grid_axes `padding` `=` $padding)?
    attr-dict
  }];
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getLogicalType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
    bool isSharded() { return getGridAttr() != nullptr; }
    bool isTrainable() { return !getFrozen(); }
    /// Whether its shard, gradient and optimizer state live in host memory:
    /// its unit is offloaded, and it is not ignored.
    bool isOffloaded();
  }];
  let hasVerifier = 1;
}

def Fsdp_BufferOp : Fsdp_Op<"buffer", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "A named model buffer: state that is not trained.";
  let description = [{
    Declares a tensor the model registers with `register_buffer` (rotary
    tables, masks, running statistics), by FQN and type. Buffers are never
    sharded and never get gradients: every rank holds the whole buffer.

    ```mlir
    fsdp.buffer @"rope.inv_freq" : tensor<32xf32>
    ```

    Rules: the type is statically shaped.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttrOf<Fsdp_StaticTensor>:$type);
  let assemblyFormat = "$sym_name `:` $type attr-dict";
}

//===----------------------------------------------------------------------===//
// Training-step body
//===----------------------------------------------------------------------===//

def Fsdp_GetParamOp : Fsdp_Op<"get_param", [
    Pure, Fsdp_InFunction, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Read this rank's copy of a parameter.";
  let description = [{
    Yields the parameter named by `name` as this rank stores it: the logical
    tensor for a replicated parameter, or this rank's padded shard
    (ceil(dim0 / N) rows, the parameter's own dtype) for a sharded one. The
    sharding passes turn the shard into a full tensor with
    `fsdp.all_gather_start` / `fsdp.wait`.

    ```mlir
    %w = fsdp.get_param @"fc1.weight" : tensor<64x32xf32>
    ```

    Rules: inside a function; `name` is an `fsdp.param`, and the result type
    is its local type.
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Fsdp_StaticTensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Fsdp_GetBufferOp : Fsdp_Op<"get_buffer", [
    Pure, Fsdp_InFunction, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Read a model buffer.";
  let description = [{
    Yields the buffer named by `name`.

    ```mlir
    %f = fsdp.get_buffer @"rope.inv_freq" : tensor<32xf32>
    ```

    Rules: inside a function; `name` is an `fsdp.buffer` and the result has
    its type.
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Fsdp_StaticTensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Fsdp_AtenOp : Fsdp_Op<"aten", [Fsdp_InFunction,
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>]> {
  let summary = "One ATen operator call, keyed by its schema name.";
  let description = [{
    A call of a functional (out-of-place) ATen operator, e.g. `aten::mm` or
    `aten::add.Tensor`: namespace `::` name, then `.` overload if any. One
    generic op covers the whole of core ATen instead of one ODS definition per
    operator, because the sharding passes never look inside compute: they only
    need its operands, results and order, and a generated op set would have to
    track every PyTorch release. Operators the passes do care about can get
    their own ops later without changing this one.

    The operands are the call's tensor (and symbolic scalar) arguments. `args`,
    when present, is the full schema argument list in order: an `index`
    integer `i` stands for operand `i`, an array for a list argument, and any
    other entry is a literal (`i64`, `f64`, `i1`, string, a type for a dtype,
    `unit` for None). Without `args` the operands are the argument list.

    `random` marks operators that draw random numbers (dropout, rand): they
    touch the generator state, so they are never merged, dropped or
    recomputed. A fused attention call at dropout 0 draws none and is not
    marked. All other calls are free of side effects.

    `module` names the PyTorch submodule (its FQN; "" for the model itself)
    whose forward made the call; a backward call names the module whose
    forward it differentiates. Wrap units and activation checkpointing are
    chosen by it.

    `checkpoint` numbers the model's own activation-checkpoint region the
    forward call ran in (`torch.utils.checkpoint.checkpoint`, which
    `checkpoint_wrapper` and Hugging Face's gradient checkpointing call):
    `fsdp-activation-checkpoint` recomputes each region's saved values in
    backward, as PyTorch would. Regions are numbered in forward order; a
    region nested in another is a region of its own.

    ```mlir
    %y = fsdp.aten "aten::addmm" (%b, %x, %w) args [0 : index, 1 : index, 2 : index, 1 : i64, 1 : i64]
           : (tensor<64xf32>, tensor<8x32xf32>, tensor<32x64xf32>) -> tensor<8x64xf32>
    ```

    Rules: inside a function; the name has the form `ns::name[.overload]` with identifier
    characters; it is not an in-place operator (`name_`), since capture is
    functional; every operand is referenced exactly once by `args`, every
    index is in range, and every literal is of a supported kind; a
    checkpoint region's number is not negative (and, checked by
    `fsdp-activation-checkpoint`, marks only forward calls).
  }];
  let arguments = (ins StrAttr:$callee, Variadic<AnyType>:$inputs,
                       OptionalAttr<ArrayAttr>:$args, UnitAttr:$random,
                       OptionalAttr<StrAttr>:$module, OptionalAttr<I64Attr>:$checkpoint);
  let results = (outs Variadic<AnyType>:$outputs);
  let assemblyFormat = [{
    $callee `(` $inputs `)` (`args` $args^)? (`random` $random^)?
    (`module` $module^)? (`checkpoint` $checkpoint^)? attr-dict
    `:` functional-type($inputs, $outputs)
  }];
  let hasVerifier = 1;
}

def Fsdp_PointwiseOp : Fsdp_Op<"pointwise", [
    Pure, Fsdp_InFunction, IsolatedFromAbove, SingleBlock]> {
  let summary = "Elementwise ATen calls computed by one generated kernel.";
  let description = [{
    A chain of elementwise `fsdp.aten` calls that runs as one kernel on a
    GPU: every output element is computed from the inputs' elements at its
    position (broadcast as ATen broadcasts), in `float`, and only the
    results are written to memory. The intermediate tensors of the chain
    are never allocated, and one kernel launch replaces one per call.
    `fsdp-fuse-pointwise` makes these ops for CUDA steps; the lowering
    prints the body as the kernel's element function and lays out its loop
    from the inputs' strides (`kernels` in the program); the runtime prints
    the loop around it, compiles it with NVRTC when it loads the program
    and launches it on the compute stream.

    The body's block arguments are the inputs; its `fsdp.aten` calls are
    the chain, in order; `fsdp.yield` names the values the op returns.
    `module` is the module of the chain's first call, for traces.

    ```mlir
    %y, %z = fsdp.pointwise (%x, %ms, %w) module "layers.0.ffn_norm"
        : (tensor<8x64xbf16>, tensor<8x1xbf16>, tensor<64xbf16>) -> (tensor<8x64xbf16>, tensor<8x64xbf16>) {
    ^bb0(%a: tensor<8x64xbf16>, %b: tensor<8x1xbf16>, %c: tensor<64xbf16>):
      %r = fsdp.aten "aten::rsqrt"(%b) : (tensor<8x1xbf16>) -> tensor<8x1xbf16>
      %n = fsdp.aten "aten::mul.Tensor"(%a, %r) : (tensor<8x64xbf16>, tensor<8x1xbf16>) -> tensor<8x64xbf16>
      %s = fsdp.aten "aten::mul.Tensor"(%n, %c) : (tensor<8x64xbf16>, tensor<64xbf16>) -> tensor<8x64xbf16>
      fsdp.yield %n, %s : tensor<8x64xbf16>, tensor<8x64xbf16>
    }
    ```

    Rules: inside a function; 1 to 8 inputs and 1 to 8 results; the body is one block whose arguments have the
    inputs' types, holding only `fsdp.aten` calls that a kernel can compute
    element by element (`fsdp/Dialect/Pointwise.h` lists them and their
    literals; none `random`) and ending with `fsdp.yield` of the results'
    types; every input and result has one floating element type (f32,
    bf16 or f16: the kernel loads and stores one storage type, so a
    condition is a comparison computed inside), the results one shape, and the inputs' shapes broadcast to
    exactly that shape; every value in the body broadcasts to it.
  }];
  let arguments = (ins Variadic<Fsdp_StaticTensor>:$inputs, OptionalAttr<StrAttr>:$module);
  let results = (outs Variadic<Fsdp_StaticTensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` (`module` $module^)? attr-dict `:` functional-type($inputs, $results) $body
  }];
  let extraClassDeclaration = [{
    /// The op's terminator.
    YieldOp getYield();
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

def Fsdp_YieldOp : Fsdp_Op<"yield", [Pure, Terminator, HasParent<"PointwiseOp">]> {
  let summary = "The values an fsdp.pointwise op returns.";
  let description = [{
    Ends the body of an `fsdp.pointwise` op and names its results, in order.

    ```mlir
    fsdp.yield %n, %s : tensor<8x64xbf16>, tensor<8x64xbf16>
    ```

    Rules: inside an `fsdp.pointwise` body, as its last op; one value per
    result of the op, of the result's type.
  }];
  let arguments = (ins Variadic<Fsdp_StaticTensor>:$values);
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
}

def Fsdp_CastOp : Fsdp_Op<"cast", [Pure, Fsdp_InFunction]> {
  let summary = "Element-type conversion of a tensor.";
  let description = [{
    Converts every element to the result's element type, as `Tensor.to(dtype)`
    does. The sharding passes fuse casts next to collectives into the
    collectives' copy-in and copy-out; this op is for the casts that remain
    (`cast_forward_inputs`, `output_dtype`). A cast to the same type folds
    away.

    ```mlir
    %h = fsdp.cast %x : tensor<8x32xf32> to tensor<8x32xbf16>
    ```

    Rules: inside a function; operand and result have the same shape; both
    element types are integer or floating point.
  }];
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Fsdp_LossOp : Fsdp_Op<"loss", [
    MemoryEffects<[MemWrite<Fsdp_StepResultResource>]>]> {
  let summary = "Marks the loss; what follows is the backward pass.";
  let description = [{
    Marks the scalar loss of the training step. It also marks the boundary
    between forward and backward: operations before it in the function's body
    form the forward pass, operations after it the backward pass.

    ```mlir
    fsdp.loss %l : tensor<f32>
    ```

    Rules: the loss is a rank-0 floating-point tensor; the op sits directly in
    a function body (not in a nested region), at most once per function.
  }];
  let arguments = (ins 0DTensorOf<[AnyFloat]>:$loss);
  let assemblyFormat = "$loss attr-dict `:` type($loss)";
  let hasVerifier = 1;
}

def Fsdp_GradientsOp : Fsdp_Op<"gradients", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemWrite<Fsdp_StepResultResource>]>]> {
  let summary = "Hands over the step's parameter gradients.";
  let description = [{
    Names the gradient of each listed parameter: `grads[i]` is the gradient of
    `params[i]` for this step, to be accumulated into the parameter's `.grad`
    and stepped by the optimizer. Before sharding a gradient has the
    parameter's logical type; once the parameter is sharded it is this rank's
    padded shard, as `fsdp.reduce_scatter_start` produces it. Tied parameters
    are one parameter and so have one gradient.

    `unreduced` marks a gradient-accumulation microbatch without
    synchronization (FSDP2's `set_requires_gradient_sync(False)`): the
    gradients are this rank's own, full (logical type) and not communicated;
    the runtime adds them to its accumulation buffer, which the next
    synchronized step reads with `fsdp.get_accumulated_grad`.

    ```mlir
    fsdp.gradients [@"fc1.weight", @"fc1.bias"] %gw, %gb
        : tensor<64x32xf32>, tensor<64xf32>
    ```

    Rules: at least one gradient; one gradient per listed parameter; no
    parameter listed twice; every name is a trainable `fsdp.param`; each
    gradient has its parameter's local type (its logical type when
    `unreduced`); the op follows the function's `fsdp.loss`, in the same
    block, and appears at most once per function.
  }];
  let arguments = (ins SymbolRefArrayAttr:$params,
                       Variadic<AnyRankedTensor>:$grads, UnitAttr:$unreduced);
  let assemblyFormat = "$params $grads (`unreduced` $unreduced^)? attr-dict `:` type($grads)";
  let hasVerifier = 1;
}

def Fsdp_GetAccumulatedGradOp : Fsdp_Op<"get_accumulated_grad", [
    Fsdp_InFunction, DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemRead<Fsdp_StepResultResource>]>]> {
  let summary = "Read the gradient accumulated over unsynchronized microbatches.";
  let description = [{
    Yields the sum of the `unreduced` gradients of parameter `name` that the
    runtime accumulated since the last synchronized step (zeros if none), in
    the parameter's logical type. The synchronized step adds it to its own
    gradient before the reduce-scatter, so gradient accumulation communicates
    once per optimizer step.

    ```mlir
    %acc = fsdp.get_accumulated_grad @"fc1.weight" : tensor<64x32xf32>
    ```

    Rules: inside a function; `name` is a trainable `fsdp.param`; the result
    has its logical type.
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Fsdp_StaticTensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Asynchronous collectives
//===----------------------------------------------------------------------===//

class Fsdp_CollectiveStartOp<string mnemonic, list<Trait> traits = []>
    : Fsdp_Op<mnemonic, !listconcat(traits, [
        Fsdp_InFunction, DeclareOpInterfaceMethods<SymbolUserOpInterface>,
        MemoryEffects<[MemRead<Fsdp_CommResource>, MemWrite<Fsdp_CommResource>]>])> {
  let results = (outs Fsdp_FutureType:$future);
  let hasVerifier = 1;
}

/// Reduce-scatter and all-reduce: a reduction kind, the dtype the data is
/// reduced in, and FSDP2's optional pre/post division for fp16.
class Fsdp_ReducingStartOp<string mnemonic> : Fsdp_CollectiveStartOp<mnemonic> {
  let arguments = (ins Variadic<Fsdp_StaticTensor>:$inputs,
                       FlatSymbolRefAttr:$grid, Shard_GridAxesAttr:$grid_axes,
                       Shard_ReductionKindAttr:$reduction,
                       TypeAttr:$reduce_dtype,
                       OptionalAttr<F64Attr>:$pre_divide,
                       OptionalAttr<F64Attr>:$post_divide,
                       OptionalAttr<FlatSymbolRefAttr>:$unit,
                       UnitAttr:$host);
  let assemblyFormat = [{
    $inputs `on` $grid `axes` `=` $grid_axes `reduction` `=` $reduction
    `reduce_dtype` `=` $reduce_dtype (`pre_divide` `=` $pre_divide^)?
    (`post_divide` `=` $post_divide^)? (`unit` $unit^)? (`host` $host^)?
    attr-dict `:` type($inputs) `->` qualified(type($future))
  }];
}

def Fsdp_AllGatherStartOp : Fsdp_CollectiveStartOp<"all_gather_start"> {
  let summary = "Start gathering a bucket of dim-0 shards into full tensors.";
  let description = [{
    Starts one all-gather over the ranks of `axes` of `grid` (N ranks) for a
    bucket of shards. Each input is this rank's padded shard (ceil(dim0 / N)
    rows); the matching result, yielded by `fsdp.wait`, is the full tensor
    with its logical dim0: the padding is dropped by the copy-out. All results
    share one element type, the communication dtype (`param_dtype` under mixed
    precision): the copy-in casts each shard to it while packing the bucket,
    so there is no separate cast copy.

    `unit` names the wrap unit whose parameters this bucket holds; `prefetch
    k` (k >= 1) records that the prefetch pass issued it k units before the
    unit runs. The inputs stay alive until the wait.
    `host` marks a bucket of an offloaded unit: the shards are in host
    memory. On a GPU the copy-in then runs on the host-to-device stream,
    after the compute stream's work issued before the start, so that the
    copy overlaps compute: each shard is copied to the device (straight into
    this rank's block of the receive buffer, or, when it must be cast, in
    chunks of at most 32 MiB through one staging buffer in its own dtype
    that lives until the wait, each chunk cast into that block) and the
    collective follows on that stream.
    `into_results` gathers straight into the results, with no staging and
    no copy-out: the start allocates each result padded to N x ceil(dim0 /
    N) rows, casts this rank's shard into its place there, and the
    collective (one in-place call per parameter, the bucket's calls
    coalesced into one launch on NCCL) fills in the other ranks'; the
    result is its first dim0 rows, alive from the start.

    ```mlir
    %f = fsdp.all_gather_start %w, %b on @dp axes = [0] unit @"layers.0"
           : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
    %w_full, %b_full = fsdp.wait %f : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
    ```

    Rules: inside a function; a non-empty bucket with one result per input;
    inputs of rank >= 1, result ranks and trailing dims equal to the input's, input dim0 =
    ceil(result dim0 / N); one result element type, reached from each input
    by a float-to-float cast or no cast; grid axes distinct, in range and
    static; `unit` names an `fsdp.unit`; `prefetch` >= 1 and only with
    `unit`; `host` only with an offloaded `unit`, and then every input is an
    `fsdp.get_param`; `into_results` not with `host`; the future has
    exactly one use, an `fsdp.wait` in the same block.
  }];
  let arguments = (ins Variadic<Fsdp_StaticTensor>:$inputs,
                       FlatSymbolRefAttr:$grid, Shard_GridAxesAttr:$grid_axes,
                       OptionalAttr<FlatSymbolRefAttr>:$unit,
                       OptionalAttr<I64Attr>:$prefetch, UnitAttr:$host, UnitAttr:$into_results);
  let assemblyFormat = [{
    $inputs `on` $grid `axes` `=` $grid_axes (`unit` $unit^)?
    (`prefetch` $prefetch^)? (`host` $host^)? (`into_results` $into_results^)?
    attr-dict `:` type($inputs) `->` qualified(type($future))
  }];
}

def Fsdp_ReduceScatterStartOp : Fsdp_ReducingStartOp<"reduce_scatter_start"> {
  let summary = "Start reducing a bucket of full gradients into dim-0 shards.";
  let description = [{
    Starts one reduce-scatter over the ranks of `axes` of `grid` (N ranks).
    Each input is a full gradient with its logical dim0; the matching result
    is this rank's padded shard of the reduced sum or average (ceil(dim0 / N)
    rows; padding rows are zero). The copy-in widens or narrows each input to
    `reduce_dtype` while packing; the copy-out casts to each result's element
    type (usually the parameter's dtype).

    `average` is the FSDP2 default for fp32 and bf16. For fp16, whose range
    overflows when summing, use `sum` with `pre_divide` (applied before the
    reduction) and `post_divide` (after), as FSDP2 does.
    `host` delivers the results in host memory, as the gradients of an
    offloaded unit: on a GPU the wait copies them (cast first, on the device)
    to pinned host memory on the device-to-host stream (beside the
    host-to-device one: the link is full duplex), and the step's end waits
    for it, so the gradients are complete when the step returns.
    Each lands as its wait completes: the runtime hands it to a host
    optimizer stepping in backward (`overlap_host_optimizer(in_backward=True)`)
    from there, which is why no later all-gather may read the unit's shards.

    ```mlir
    %f = fsdp.reduce_scatter_start %gw on @dp axes = [0] reduction = average reduce_dtype = f32
           : tensor<10x32xbf16> -> !fsdp.future<tensor<3x32xf32>>
    ```

    Rules: inside a function; a non-empty bucket with one result per input;
    inputs of rank >= 1; result dim0 = ceil(input dim0 / N), other dims equal; inputs, results and
    `reduce_dtype` floating point; reduction `sum` or `average`; `average`
    not with an f16 reduce dtype; divide factors positive and only with
    `sum`; grid axes distinct, in range and static; `unit` names an
    `fsdp.unit`; `host` only with an offloaded `unit`, and then the results
    are read only by `fsdp.gradients` and no `host` all-gather of the unit
    follows (the host optimizer may step its shards once the gradients
    land); the future has exactly one use, an `fsdp.wait` in the same block.
  }];
}

def Fsdp_AllReduceStartOp : Fsdp_ReducingStartOp<"all_reduce_start"> {
  let summary = "Start reducing a bucket of tensors on every rank.";
  let description = [{
    Starts one all-reduce over the ranks of `axes` of `grid`; every rank gets
    the reduced tensors. It carries gradients for NO_SHARD (DDP-like) and
    the replicate axis of HYBRID_SHARD, and small reductions such as the
    global gradient norm. Copy-in casts to `reduce_dtype`, copy-out to each
    result's element type. With `unit` it reduces that unit's gradients;
    without, it sums activations (a lowered `fsdp.data_parallel_sum`), which
    keep their dtype and their place: the passes that retype and schedule
    gradient reductions leave it alone.

    ```mlir
    %f = fsdp.all_reduce_start %g on @hsdp axes = [0] reduction = average reduce_dtype = f32
           : tensor<3x32xf32> -> !fsdp.future<tensor<3x32xf32>>
    ```

    Rules: inside a function; a non-empty bucket with one result per input,
    of equal shapes;
    inputs, results and `reduce_dtype` floating point; reduction `sum`,
    `average`, `max`, `min` or `product`; `average` not with an f16 reduce
    dtype; divide factors positive and only with `sum`; grid axes distinct,
    in range and static; `unit` names an `fsdp.unit`; `host` as for
    `fsdp.reduce_scatter_start` (it ends hybrid sharding's reduction); the
    future has exactly one use, an `fsdp.wait` in the same block.
  }];
}

def Fsdp_DataParallelSumOp : Fsdp_Op<"data_parallel_sum", [Fsdp_InFunction,
    AllTypesMatch<["input", "result"]>,
    MemoryEffects<[MemRead<Fsdp_CommResource>, MemWrite<Fsdp_CommResource>]>]> {
  let summary = "Sum a tensor of the step over every data-parallel rank.";
  let description = [{
    Every rank gets the elementwise sum of `input` over all data-parallel
    ranks (the whole grid, replicas included). Capture writes it where the
    model reduces activations across ranks inside its step, as
    `nn.SyncBatchNorm` does with its batch statistics (forward) and their
    gradients (backward); the gradient of a sum over ranks is the sum over
    ranks of the gradients. It is written before sharding, when no grid
    exists: `fsdp-shard-parameters` lowers it to an `fsdp.all_reduce_start`
    over every axis of its grid (reduction `sum`, in the input's element
    type) and its `fsdp.wait`.

    ```mlir
    %total = fsdp.data_parallel_sum %local : tensor<16xf32>
    ```

    Rules: inside a function; a floating-point tensor; the result has the
    input's type.
  }];
  let arguments = (ins Fsdp_StaticTensor:$input);
  let results = (outs Fsdp_StaticTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Fsdp_WaitOp : Fsdp_Op<"wait", [Fsdp_InFunction,
    DeclareOpInterfaceMethods<InferTypeOpInterface>,
    MemoryEffects<[MemRead<Fsdp_CommResource>, MemWrite<Fsdp_CommResource>]>]> {
  let summary = "Wait for an asynchronous collective and take its results.";
  let description = [{
    Blocks (the compute stream, not the host) until the collective that made
    `future` has finished, and yields its results, typed by the future. For
    an all-gather the results are gathered buffers, alive until the
    `fsdp.reshard` that frees them.

    ```mlir
    %w_full = fsdp.wait %f : !fsdp.future<tensor<10x32xbf16>>
    ```

    Rules: inside a function; the future comes straight from a `*_start` op.
  }];
  let arguments = (ins Fsdp_FutureType:$future);
  let results = (outs Variadic<Fsdp_StaticTensor>:$results);
  let assemblyFormat = "$future attr-dict `:` qualified(type($future))";
  let hasVerifier = 1;
}

def Fsdp_ReshardOp : Fsdp_Op<"reshard", [Fsdp_InFunction,
    MemoryEffects<[MemFree<Fsdp_GatheredBufferResource>]>]> {
  let summary = "Free gathered parameter buffers.";
  let description = [{
    Frees unsharded parameter buffers that an all-gather produced, returning
    the parameters to their sharded state (FSDP2's reshard). With
    `reshard_after_forward` it follows a unit's last forward use, and a later
    all-gather brings the parameters back for backward.

    ```mlir
    fsdp.reshard %w_full, %b_full : tensor<10x32xbf16>, tensor<10xbf16>
    ```

    Rules: inside a function; at least one buffer; every operand is a
    result of an `fsdp.wait` on an
    `fsdp.all_gather_start`; no operand is freed twice; every other use of a
    buffer precedes the free in the same block (a use inside a nested region
    counts at its enclosing op); a collective reading the buffer has been
    waited for before the free.
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$buffers);
  let assemblyFormat = "$buffers attr-dict `:` type($buffers)";
  let hasVerifier = 1;
}

def Fsdp_ReleaseOp : Fsdp_Op<"release", [Fsdp_InFunction,
    MemoryEffects<[MemFree<Fsdp_ValueStorageResource>]>]> {
  let summary = "End the lifetime of step values: the runtime drops them here.";
  let description = [{
    Marks the point after which the listed values are dead. The runtime drops
    its reference to each of them at this op, so their storage returns to the
    allocator as soon as no view shares it; the memory report frees them at
    the same op. `fsdp-plan-lifetimes` places one release after each value's
    last use, which makes every lifetime of the step explicit: a value that
    no release lists lives until the step returns.

    A collective start copies its inputs into its own staging buffer, so an
    input may be released right after the start; the staging buffers live
    until the collective's `fsdp.wait`.

    ```mlir
    %h = fsdp.aten "aten::gelu" (%x) : (tensor<8x32xf32>) -> (tensor<8x32xf32>)
    fsdp.release %x : tensor<8x32xf32>
    ```

    Rules: inside a function; at least one value; no value listed twice or
    released by two ops; a gathered buffer (a result of `fsdp.wait` on an
    all-gather) is freed by `fsdp.reshard`, not released; every other use of
    a released value precedes the release in the same block (a use inside a
    nested region counts at its enclosing op). Views may outlive the value
    they were made from: they keep its storage alive themselves.
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$values);
  let assemblyFormat = "$values attr-dict `:` type($values)";
  let hasVerifier = 1;
}

def Fsdp_AllSliceOp : Fsdp_Op<"all_slice", [
    Pure, Fsdp_InFunction, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Keep this rank's dim-0 shard of a full tensor (no communication).";
  let description = [{
    Cuts this rank's padded dim-0 shard out of a full tensor that every rank
    of the group holds, as `shard.all_slice` does, without communicating. It
    implements an integer `reshard_after_forward`: after forward a unit keeps
    a shard over a smaller group (e.g. the ranks of one node) so that the
    backward all-gather stays within that group.

    ```mlir
    %s = fsdp.all_slice %w_full on @grid2d axes = [1] : tensor<10x32xbf16> -> tensor<5x32xbf16>
    ```

    Rules: inside a function; input rank >= 1; result dim0 = ceil(input
    dim0 / N) and the other
    dims and the element type equal the input's; grid axes distinct, in range
    and static.
  }];
  let arguments = (ins Fsdp_StaticTensor:$input, FlatSymbolRefAttr:$grid,
                       Shard_GridAxesAttr:$grid_axes);
  let results = (outs Fsdp_StaticTensor:$result);
  let assemblyFormat = [{
    $input `on` $grid `axes` `=` $grid_axes attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

#endif // FSDP_OPS_TD
