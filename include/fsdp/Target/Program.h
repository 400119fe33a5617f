//===- Program.h - lowering a sharded module to an fsdp_rt program -*- C++ -*-===//

#ifndef FSDP_TARGET_PROGRAM_H
#define FSDP_TARGET_PROGRAM_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::fsdp {

/// Writes the module as an fsdp_rt program (JSON, format version
/// fsdp_rt::kProgramVersion): the manifest (groups, parameters with their
/// shard layout, buffers) and, per function, the instruction list that the
/// prebuilt runtime executes. Step functions must be scheduled and verified
/// (fsdp-verify-schedule); anything else is reported on its op.
LogicalResult translateToProgram(ModuleOp module, llvm::raw_ostream &os);

} // namespace mlir::fsdp

#endif // FSDP_TARGET_PROGRAM_H
