//===- FsdpDialect.h - the fsdp dialect, its types and resources -*- C++ -*-===//

#ifndef FSDP_DIALECT_FSDPDIALECT_H
#define FSDP_DIALECT_FSDPDIALECT_H

#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "fsdp/FsdpDialect.h.inc"

#define GET_TYPEDEF_CLASSES
#include "fsdp/FsdpTypes.h.inc"

namespace mlir::fsdp {

/// Marks an op that a recompute pass cloned into backward: work that the
/// step does twice, which model FLOPs (MFU) do not count.
inline constexpr llvm::StringLiteral kRecomputedAttr = "fsdp.recomputed";
/// On a step function: the runtime captures it once and replays it as a CUDA graph.
inline constexpr llvm::StringLiteral kCudaGraphAttr = "fsdp.cuda_graph";

/// The communication streams that all collectives read and write.
struct CommResource : public SideEffects::Resource::Base<CommResource> {
  StringRef getName() final { return "fsdp.comm"; }
};

/// The step's results as the runtime sees them (loss, gradients).
struct StepResultResource : public SideEffects::Resource::Base<StepResultResource> {
  StringRef getName() final { return "fsdp.step_result"; }
};

/// Unsharded parameter storage produced by all-gathers and freed by reshard.
struct GatheredBufferResource
    : public SideEffects::Resource::Base<GatheredBufferResource> {
  StringRef getName() final { return "fsdp.gathered_buffer"; }
};

/// Step values (activations, gradients, casts) whose storage fsdp.release frees.
struct ValueStorageResource : public SideEffects::Resource::Base<ValueStorageResource> {
  StringRef getName() final { return "fsdp.value_storage"; }
};

/// The random-number generator state that `fsdp.aten ... random` calls advance.
struct RandomGeneratorResource
    : public SideEffects::Resource::Base<RandomGeneratorResource> {
  StringRef getName() final { return "fsdp.rng"; }
};

} // namespace mlir::fsdp

#endif // FSDP_DIALECT_FSDPDIALECT_H
