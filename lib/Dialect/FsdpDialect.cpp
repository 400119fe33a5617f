//===- FsdpDialect.cpp - fsdp dialect registration and types --------------===//

#include "fsdp/Dialect/FsdpDialect.h"
#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp_rt/ProgramFormat.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
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

/// Checks the discardable `fsdp.*` attributes the dialect defines (see the
/// dialect description); anything else under the prefix is a typo.
LogicalResult FsdpDialect::verifyOperationAttribute(Operation *op, NamedAttribute attribute) {
  StringRef name = attribute.getName().getValue();
  Attribute value = attribute.getValue();
  if (name == "fsdp.mixed_precision") {
    auto policy = dyn_cast<DictionaryAttr>(value);
    if (!isa<ModuleOp>(op) || !policy)
      return op->emitError("fsdp.mixed_precision must be a dictionary on the module");
    if (!policy.get("param_dtype"))
      return op->emitError("fsdp.mixed_precision needs param_dtype");
    for (NamedAttribute field : policy) {
      StringRef key = field.getName().getValue();
      if (key == "cast_forward_inputs") {
        if (!isa<BoolAttr>(field.getValue()))
          return op->emitError("fsdp.mixed_precision.cast_forward_inputs must be true or false");
        continue;
      }
      if (key != "param_dtype" && key != "reduce_dtype" && key != "output_dtype")
        return op->emitError() << "fsdp.mixed_precision has unknown field '" << key << "'";
      auto type = dyn_cast<TypeAttr>(field.getValue());
      if (!type || !isa<FloatType>(type.getValue()))
        return op->emitError() << "fsdp.mixed_precision." << key << " must be a float type";
    }
    return success();
  }
  if (name == "fsdp.device") {
    auto device = dyn_cast<StringAttr>(value);
    if (!isa<ModuleOp>(op) || !device)
      return op->emitError("fsdp.device must be a string on the module");
    if (!fsdp_rt::isDeviceKind(device.getValue()))
      return op->emitError() << "fsdp.device '" << device.getValue() << "' is not a device fsdpc targets; "
                             << "use " << llvm::StringRef(fsdp_rt::kDeviceKindList);
    return success();
  }
  if (name == "fsdp.collective_hash") {
    if (!isa<StringAttr>(value))
      return op->emitError("fsdp.collective_hash must be a string");
    return success();
  }
  if (name == "fsdp.collective_count") {
    if (!isa<IntegerAttr>(value))
      return op->emitError("fsdp.collective_count must be an integer");
    return success();
  }
  if (name == "fsdp.memory" || name == "fsdp.comm") {
    auto report = dyn_cast<DictionaryAttr>(value);
    if (!report || !llvm::all_of(report, [](NamedAttribute field) {
          return isa<IntegerAttr>(field.getValue());
        }))
      return op->emitError() << name << " must be a dictionary of integers";
    return success();
  }
  if (name == kCudaGraphAttr) {
    if (!isa<UnitAttr>(value) || !isa<FunctionOpInterface>(op))
      return op->emitError("fsdp.cuda_graph must be a unit attribute on a function");
    return success();
  }
  if (name == kRecomputedAttr) {
    // A recomputed call fused into a kernel keeps its mark inside the kernel's body.
    Operation *parent = op->getParentOp();
    if (isa_and_nonnull<PointwiseOp>(parent))
      parent = parent->getParentOp();
    if (!isa<UnitAttr>(value) || !isa_and_nonnull<FunctionOpInterface>(parent))
      return op->emitError("fsdp.recomputed must be a unit attribute on an op of a function "
                           "or of an fsdp.pointwise body in one");
    if (auto aten = dyn_cast<AtenOp>(op); aten && aten.getCheckpoint())
      return op->emitError("a recomputed call runs in backward, and checkpoint regions mark forward calls");
    return success();
  }
  return op->emitError() << "unknown fsdp attribute '" << name << "'";
}
