//===- fsdp-translate.cpp - fsdp IR to host code --------------------------===//
//
// `fsdp-translate --fsdp-to-cpp step.mlir` writes the C++ that the Python
// driver builds against libfsdp_rt and LibTorch.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpDialect.h"
#include "fsdp/Target/Cpp.h"

#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"

int main(int argc, char **argv) {
  mlir::TranslateFromMLIRRegistration toCpp(
      "fsdp-to-cpp", "Lower sharded fsdp step functions to C++ over fsdp_rt and ATen",
      [](mlir::ModuleOp module, llvm::raw_ostream &os) {
        return mlir::fsdp::translateToCpp(module, os);
      },
      [](mlir::DialectRegistry &registry) {
        registry.insert<mlir::fsdp::FsdpDialect, mlir::func::FuncDialect,
                        mlir::shard::ShardDialect, mlir::scf::SCFDialect,
                        mlir::cf::ControlFlowDialect>();
      });
  return mlir::failed(mlir::mlirTranslateMain(argc, argv, "fsdp-translate: fsdp IR to host code"));
}
