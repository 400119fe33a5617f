//===- AtenOpName.h - ATen schema names --------------------------*- C++ -*-===//
//
// Splits and classifies operator names such as "aten::add.Tensor", the key of
// the generic `fsdp.aten` op.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_SUPPORT_ATENOPNAME_H
#define FSDP_SUPPORT_ATENOPNAME_H

#include "llvm/ADT/StringRef.h"

#include <optional>

namespace mlir::fsdp {

struct AtenOpName {
  llvm::StringRef nameSpace; ///< "aten", "prims", a custom op library, ...
  llvm::StringRef name;      ///< "add", "add_", "_to_copy", "__and__"
  llvm::StringRef overload;  ///< "Tensor", or empty for the default overload

  /// `ns::name[.overload]`, each part an identifier ([A-Za-z_][A-Za-z0-9_]*).
  static std::optional<AtenOpName> parse(llvm::StringRef qualified);

  /// True for operators that write into an input (`add_`, `__iand__`);
  /// dunder operators such as `__and__` are functional.
  bool isInPlace() const;
};

/// Whether the operator `qualified` (e.g. "aten::permute") returns views that
/// share storage with its first argument: such results keep that storage
/// alive, so freeing it is only safe after their last use too.
bool isViewOperator(llvm::StringRef qualified);

} // namespace mlir::fsdp

#endif // FSDP_SUPPORT_ATENOPNAME_H
