//===- ElementTypes.h - the element types a program may use -----*- C++ -*-===//
//
// The one table of tensor element types that cross the compiler/runtime
// boundary. A program names an element type by its MLIR spelling ("f32",
// "bf16", "i1", "complex<f32>", ...); fsdp-translate rejects any type not
// listed here, and the runtime maps each entry to its ATen scalar type
// (runtime/src/Program.cpp), so the two sides cannot disagree.
//
// Header-only, C++17, no dependencies (shared with the compiler).
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_ELEMENTTYPES_H
#define FSDP_RT_ELEMENTTYPES_H

#include <optional>
#include <string_view>

namespace fsdp_rt {

enum class ElementType {
  F32, F64, F16, BF16, I64, I32, I16, I8, U64, U8, Bool, Complex64, Complex128, F8E4M3FN, F8E5M2,
};

struct ElementTypeInfo {
  ElementType type;
  std::string_view name; // MLIR spelling
  int bytes;
};

inline constexpr ElementTypeInfo kElementTypes[] = {
    {ElementType::F32, "f32", 4},
    {ElementType::F64, "f64", 8},
    {ElementType::F16, "f16", 2},
    {ElementType::BF16, "bf16", 2},
    {ElementType::I64, "i64", 8},
    {ElementType::I32, "i32", 4},
    {ElementType::I16, "i16", 2},
    {ElementType::I8, "i8", 1},
    {ElementType::U64, "ui64", 8}, // fused attention's random-number state
    {ElementType::U8, "ui8", 1},
    {ElementType::Bool, "i1", 1},
    {ElementType::Complex64, "complex<f32>", 8},
    {ElementType::Complex128, "complex<f64>", 16},
    {ElementType::F8E4M3FN, "f8E4M3FN", 1},
    {ElementType::F8E5M2, "f8E5M2", 1},
};

inline std::optional<ElementTypeInfo> lookupElementType(std::string_view name) {
  for (const ElementTypeInfo &info : kElementTypes)
    if (info.name == name)
      return info;
  return std::nullopt;
}

} // namespace fsdp_rt

#endif // FSDP_RT_ELEMENTTYPES_H
