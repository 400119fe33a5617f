//===- fsdp-translate.cpp - fsdp IR to host code --------------------------===//
//
// `fsdp-translate --fsdp-to-program step.mlir` writes the program (manifest
// and instruction lists, JSON) that the prebuilt runtime, libfsdp_rt, loads.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpDialect.h"
#include "fsdp/Target/Program.h"

#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"

int main(int argc, char **argv) {
  mlir::TranslateFromMLIRRegistration toProgram(
      "fsdp-to-program", "Lower a sharded fsdp module to an fsdp_rt program (JSON)",
      [](mlir::ModuleOp module, llvm::raw_ostream &os) {
        return mlir::fsdp::translateToProgram(module, os);
      },
      [](mlir::DialectRegistry &registry) {
        registry.insert<mlir::fsdp::FsdpDialect, mlir::func::FuncDialect,
                        mlir::shard::ShardDialect, mlir::scf::SCFDialect,
                        mlir::cf::ControlFlowDialect>();
      });
  return mlir::failed(mlir::mlirTranslateMain(argc, argv, "fsdp-translate: fsdp IR to host code"));
}
