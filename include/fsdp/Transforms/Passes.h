//===- Passes.h - fsdp-opt passes --------------------------------*- C++ -*-===//

#ifndef FSDP_TRANSFORMS_PASSES_H
#define FSDP_TRANSFORMS_PASSES_H

#include "fsdp/Dialect/FsdpDialect.h"

#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::fsdp {

#define GEN_PASS_DECL
#include "fsdp/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "fsdp/Passes.h.inc"

/// Registers `fsdp-sharding-pipeline`, which runs every pass above with one
/// set of FSDP2-style options.
void registerShardingPipeline();

} // namespace mlir::fsdp

#endif // FSDP_TRANSFORMS_PASSES_H
