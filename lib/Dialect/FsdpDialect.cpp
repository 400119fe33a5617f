//===- FsdpDialect.cpp - fsdp dialect registration and types --------------===//

#include "fsdp/Dialect/FsdpDialect.h"
#include "fsdp/Dialect/FsdpOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::fsdp;

#include "fsdp/FsdpDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "fsdp/FsdpTypes.cpp.inc"

void FsdpDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "fsdp/FsdpTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "fsdp/FsdpOps.cpp.inc"
      >();
}

LogicalResult FutureType::verify(function_ref<InFlightDiagnostic()> emitError,
                                 ArrayRef<Type> results) {
  if (results.empty())
    return emitError() << "!fsdp.future needs at least one result type";
  for (auto [index, type] : llvm::enumerate(results)) {
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor || !tensor.hasStaticShape())
      return emitError() << "!fsdp.future result " << index
                         << " must be a statically shaped tensor, got " << type;
  }
  return success();
}
