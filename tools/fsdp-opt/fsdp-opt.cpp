//===- fsdp-opt.cpp - the fsdpc optimizer driver --------------------------===//
//
// Parses fsdp-dialect IR, verifies it, runs passes, prints the result. Our
// dialect and passes plus the upstream dialects a step uses (func, shard;
// scf and cf so that control flow can be diagnosed).
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpDialect.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
  mlir::fsdp::registerFsdpPasses();
  mlir::fsdp::registerShardingPipeline();

  mlir::DialectRegistry registry;
  registry.insert<mlir::fsdp::FsdpDialect, mlir::func::FuncDialect,
                  mlir::shard::ShardDialect, mlir::scf::SCFDialect,
                  mlir::cf::ControlFlowDialect>();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "fsdp-opt: the fsdpc sharding compiler driver\n", registry));
}
