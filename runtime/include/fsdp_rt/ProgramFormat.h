//===- ProgramFormat.h - the program format's shared definitions -*- C++ -*-===//
//
// What the compiler (fsdp-translate, the writer) and the runtime (the one
// reader; Python reads programs through it) must agree on: the version, the
// instruction kinds with their `op` spellings, and the reductions. Both sides
// take these names from here, so neither can spell one the other does not
// know. docs/program.md is the schema's manual. Header-only, no dependencies.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_PROGRAMFORMAT_H
#define FSDP_RT_PROGRAMFORMAT_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace fsdp_rt {

/// Bump on any change to the program's JSON schema (docs/program.md).
inline constexpr int64_t kProgramVersion = 10;
inline constexpr std::string_view kProgramFormat = "fsdpc.program";

/// The device kinds a step is captured for and runs on (the module's
/// `fsdp.device`, the program's "device"); c10's spelling.
inline constexpr std::string_view kDeviceKinds[] = {"cpu", "cuda"};
inline constexpr std::string_view kDeviceKindList = "cpu or cuda";
inline constexpr std::string_view kDefaultDeviceKind = "cpu";

inline bool isDeviceKind(std::string_view name) {
  for (std::string_view kind : kDeviceKinds)
    if (kind == name)
      return true;
  return false;
}

/// The most tensors a generated kernel takes, and makes (a launch's
/// arguments stay small): the compiler fuses within it, the loader checks it.
inline constexpr size_t kMostKernelTensors = 8;
/// The most loop dimensions a generated kernel has after merging those that
/// every tensor steps through alike.
inline constexpr size_t kMostKernelDimensions = 8;

enum class InstructionKind {
  Param, Buffer, AccumulatedGrad, Aten, Cast, Loss, Gradients, AllGather, ReduceScatter,
  AllReduce, Wait, Release, Reshard, AllSlice, Return, Pointwise,
};

struct InstructionKindInfo {
  InstructionKind kind;
  std::string_view op; // the instruction's "op" member
};

inline constexpr InstructionKindInfo kInstructionKinds[] = {
    {InstructionKind::Param, "param"},
    {InstructionKind::Buffer, "buffer"},
    {InstructionKind::AccumulatedGrad, "accumulated_grad"},
    {InstructionKind::Aten, "aten"},
    {InstructionKind::Cast, "cast"},
    {InstructionKind::Loss, "loss"},
    {InstructionKind::Gradients, "gradients"},
    {InstructionKind::AllGather, "all_gather"},
    {InstructionKind::ReduceScatter, "reduce_scatter"},
    {InstructionKind::AllReduce, "all_reduce"},
    {InstructionKind::Wait, "wait"},
    {InstructionKind::Release, "release"},
    {InstructionKind::Reshard, "reshard"},
    {InstructionKind::AllSlice, "all_slice"},
    {InstructionKind::Return, "return"},
    {InstructionKind::Pointwise, "pointwise"},
};

inline constexpr std::string_view opName(InstructionKind kind) {
  for (const InstructionKindInfo &info : kInstructionKinds)
    if (info.kind == kind)
      return info.op;
  return "";
}

inline std::optional<InstructionKind> instructionKindOf(std::string_view op) {
  for (const InstructionKindInfo &info : kInstructionKinds)
    if (info.op == op)
      return info.kind;
  return std::nullopt;
}

inline constexpr bool isCollectiveStart(InstructionKind kind) {
  return kind == InstructionKind::AllGather || kind == InstructionKind::ReduceScatter ||
         kind == InstructionKind::AllReduce;
}

} // namespace fsdp_rt

#endif // FSDP_RT_PROGRAMFORMAT_H
