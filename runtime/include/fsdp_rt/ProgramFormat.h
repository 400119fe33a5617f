//===- ProgramFormat.h - the program format's version -----------*- C++ -*-===//
//
// Shared by the compiler (which writes programs) and the runtime (which
// refuses any other version). Header-only, no dependencies.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_PROGRAMFORMAT_H
#define FSDP_RT_PROGRAMFORMAT_H

#include <cstdint>

namespace fsdp_rt {

/// Bump on any change to the program's JSON schema (docs/program.md).
inline constexpr int64_t kProgramVersion = 1;

} // namespace fsdp_rt

#endif // FSDP_RT_PROGRAMFORMAT_H
