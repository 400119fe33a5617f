//===- FsdpDialect.td - the fsdp dialect and its types -----*- tablegen -*-===//

#ifndef FSDP_DIALECT_TD
#define FSDP_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Fsdp_Dialect : Dialect {
  let name = "fsdp";
  let cppNamespace = "::mlir::fsdp";
  let summary = "Fully sharded data-parallel training steps: capture, sharding, communication.";
  let description = [{
    The `fsdp` dialect describes one training step of a PyTorch model and the
    fully sharded data-parallel (FSDP / ZeRO-3) schedule that `fsdp-opt` builds
    for it. A module holds:

    * **Wrap units** (`fsdp.unit`): FSDP2's communication groups. Each unit
      owns the parameters that name it; one unit is the root, which owns the
      rest.
    * **Parameters** (`fsdp.param`): named by their PyTorch FQN, with logical
      shape, dtype, trainable or frozen, and, once sharded, the device grid,
      the grid axes they are split over and the dim-0 padding that makes every
      shard the same size.
    * **Device grids**: the upstream `shard.grid` op, reused as is. A 1-D grid
      is plain FSDP; a 2-D grid with parameters split over one axis is hybrid
      sharding (replicated over the other).
    * **Training-step functions** (`func.func`) whose bodies read parameters
      (`fsdp.get_param`), compute with ATen ops (`fsdp.aten`), mark the loss
      (`fsdp.loss`, which also separates forward from backward) and hand over
      parameter gradients (`fsdp.gradients`).

    Communication is explicit and asynchronous. `fsdp.all_gather_start`,
    `fsdp.reduce_scatter_start` and `fsdp.all_reduce_start` each move a bucket
    of tensors and return an `!fsdp.future`; exactly one `fsdp.wait` yields the
    results. A start keeps its input buffers alive until its wait; gathered
    buffers live from their wait until `fsdp.reshard` frees them. Prefetching
    is an all-gather started earlier than needed. Dtype casts happen inside the
    collectives' copy-in and copy-out wherever possible; `fsdp.cast` is the
    stand-alone cast for the rest.

    Discardable attributes: `fsdp.device` on the module is the device kind
    the step was captured for and will run on (`"cpu"` or `"cuda"`: which
    fused kernels capture kept whole; absent means `"cpu"`); the program
    carries it and the runtime refuses to load it for another kind.
    `fsdp.mixed_precision` on the module records the
    FSDP2 mixed precision policy the step was captured with (`param_dtype`,
    and optionally `reduce_dtype`, `output_dtype`: float types;
    `cast_forward_inputs`: bool). The passes add `fsdp.collective_hash`
    (string) and `fsdp.collective_count` (integer) and the reports
    `fsdp.memory` and `fsdp.comm` (dictionaries of integers) to step
    functions; the recompute passes mark each op they clone into backward
    with `fsdp.recomputed` (a unit attribute), so that the work done twice
    can be told apart (model FLOPs leave it out); `fsdp-cuda-graph` marks
    step functions `fsdp.cuda_graph` (a unit attribute): the runtime
    captures each once and replays it as a CUDA graph. Other `fsdp.` attributes
    are errors.

    Padding never leaves the dialect's collectives: all-gather results and
    reduce-scatter inputs have the parameter's logical shape, and only shards
    (`ceil(dim0 / N)` rows on every rank) carry padding rows.
  }];
  let dependentDialects = ["::mlir::shard::ShardDialect"];
  let useDefaultTypePrinterParser = 1;
  let hasOperationAttrVerify = 1;
}

class Fsdp_Op<string mnemonic, list<Trait> traits = []>
    : Op<Fsdp_Dialect, mnemonic, traits>;

/// The communication stream(s): collectives read and write it, so no pass may
/// drop, merge or reorder them against each other.
def Fsdp_CommResource : Resource<"::mlir::fsdp::CommResource">;
/// What the step hands to the runtime (loss, gradients): writing it keeps the
/// markers alive through dead-code elimination.
def Fsdp_StepResultResource : Resource<"::mlir::fsdp::StepResultResource">;
/// Gathered (unsharded) parameter storage, which `fsdp.reshard` frees.
def Fsdp_GatheredBufferResource : Resource<"::mlir::fsdp::GatheredBufferResource">;

/// Storage of other step values, which `fsdp.release` frees.
def Fsdp_ValueStorageResource : Resource<"::mlir::fsdp::ValueStorageResource">;

def Fsdp_FutureType : TypeDef<Fsdp_Dialect, "Future"> {
  let mnemonic = "future";
  let summary = "!fsdp.future (pending results of a collective)";
  let description = [{
    Returned by a `*_start` collective and consumed by exactly one
    `fsdp.wait`, which yields tensors of the listed types. Example:
    `!fsdp.future<tensor<128x64xbf16>, tensor<64xbf16>>`.
  }];
  let parameters = (ins ArrayRefParameter<"::mlir::Type", "result types">:$results);
  let assemblyFormat = "`<` $results `>`";
  let genVerifyDecl = 1;
}

#endif // FSDP_DIALECT_TD
