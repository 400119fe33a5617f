//===- FsdpOps.h - fsdp dialect operations ----------------------*- C++ -*-===//

#ifndef FSDP_DIALECT_FSDPOPS_H
#define FSDP_DIALECT_FSDPOPS_H

#include "fsdp/Dialect/FsdpDialect.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "fsdp/FsdpOps.h.inc"

#endif // FSDP_DIALECT_FSDPOPS_H
