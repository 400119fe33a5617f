//===- Cpp.h - lowering a sharded step to C++ over fsdp_rt -------*- C++ -*-===//

#ifndef FSDP_TARGET_CPP_H
#define FSDP_TARGET_CPP_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::fsdp {

/// Writes the module's step functions as C++ over the fsdp runtime
/// (runtime/include/fsdp_rt/Step.h) and ATen. The module must be sharded and
/// verified (fsdp-verify-schedule); anything else is reported on its op.
LogicalResult translateToCpp(ModuleOp module, llvm::raw_ostream &os);

} // namespace mlir::fsdp

#endif // FSDP_TARGET_CPP_H
