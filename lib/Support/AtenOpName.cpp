//===- AtenOpName.cpp - ATen schema names ---------------------------------===//

#include "fsdp/Support/AtenOpName.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"

using namespace mlir::fsdp;

static bool isIdentifier(llvm::StringRef text) {
  if (text.empty() || llvm::isDigit(text.front()))
    return false;
  return llvm::all_of(text, [](char c) { return llvm::isAlnum(c) || c == '_'; });
}

std::optional<AtenOpName> AtenOpName::parse(llvm::StringRef qualified) {
  auto [nameSpace, rest] = qualified.split("::");
  if (rest.empty() && !qualified.contains("::"))
    return std::nullopt;
  auto [name, overload] = rest.split('.');
  bool hasOverload = rest.contains('.');
  if (!isIdentifier(nameSpace) || !isIdentifier(name) ||
      (hasOverload && !isIdentifier(overload)))
    return std::nullopt;
  return AtenOpName{nameSpace, name, overload};
}

bool AtenOpName::isInPlace() const {
  if (name.size() > 4 && name.starts_with("__") && name.ends_with("__"))
    return llvm::StringSwitch<bool>(name)
        .Cases({"__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"}, true)
        .Default(false);
  return name.ends_with("_");
}

bool mlir::fsdp::isViewOperator(llvm::StringRef qualified) {
  return llvm::StringSwitch<bool>(qualified)
      .Cases({"aten::view", "aten::_unsafe_view", "aten::permute", "aten::transpose.int",
              "aten::t", "aten::expand", "aten::alias", "aten::slice.Tensor",
              "aten::select.int", "aten::unsqueeze", "aten::squeeze", "aten::squeeze.dim",
              "aten::squeeze.dims", "aten::as_strided", "aten::split.Tensor",
              "aten::split_with_sizes", "aten::unbind.int", "aten::diagonal", "aten::unfold",
              "aten::detach", "aten::view_as_real", "aten::view_as_complex"},
             true)
      .Default(false);
}
