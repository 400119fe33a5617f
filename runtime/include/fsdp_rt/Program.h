//===- Program.h - a compiled step as the runtime holds it ------*- C++ -*-===//
//
// A program (fsdp-translate --fsdp-to-program, docs/program.md) is loaded once
// per rank: every ATen operator handle is resolved and every literal argument
// converted to its schema type here, so that running a step does no lookups
// and no parsing. Instructions address values by slot; the compiler decided
// when each slot is dropped (release/reshard), and the executor follows it.
//
// This is the program's only reader: Python reads the manifest (groups,
// parameters, buffers) from here through the extension. Loading ends with
// one validation step (validateProgram) that checks every index the executor
// will use (slots, futures, groups, names, shapes) against the program's own
// tables, and every future's start/wait pairing, so nothing a program says
// can make the executor read or write out of bounds.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_PROGRAM_H
#define FSDP_RT_PROGRAM_H

#include "fsdp_rt/Json.h"
#include "fsdp_rt/ProgramFormat.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp_rt {

class LoadedKernels;

enum class Reduction { Sum, Average, Max, Min, Product };

/// The ATen scalar type of an element-type name (fsdp_rt/ElementTypes.h).
c10::ScalarType scalarTypeOf(const std::string &elementType);
/// The element-type name of an ATen scalar type (the inverse of scalarTypeOf).
std::string elementTypeOf(c10::ScalarType type);

/// One argument of an ATen call: a constant converted at load, or slots read
/// when the instruction runs.
struct AtenArgument {
  enum class Kind { Constant, Tensor, TensorList, OptionalTensorList };
  Kind kind = Kind::Constant;
  c10::IValue constant;
  std::vector<int> slots; // -1: None inside an optional tensor list
};

struct Instruction {
  using Kind = InstructionKind;
  Kind kind;
  std::string name;               // parameter/buffer name, ATen operator, or the op for traces
  std::string where;              // the user's source line, when known
  std::optional<c10::OperatorHandle> op;
  std::vector<AtenArgument> args;
  std::vector<int> inputs;        // slots read
  std::vector<int> results;       // slots written; -1 for a `none` result
  /// gradients: the parameter of each input; a host reduction's wait: the
  /// parameter whose gradient each result is ("" for none)
  std::vector<std::string> params;
  std::string group;              // collectives and all_slice
  std::string unit;               // collectives: the wrap unit, for traces
  /// all_gather: the inputs are shards in host memory; reductions: the
  /// results go to host memory (an offloaded unit's gradients).
  bool host = false;
  /// all_gather: the collective writes each result's padded full tensor,
  /// allocated at the start (no receive buffer, no copy-out).
  bool intoResults = false;
  int future = -1;
  std::vector<std::vector<int64_t>> shapes; // collectives: result shapes
  std::vector<c10::ScalarType> dtypes;      // collectives: result dtypes; cast: [target]
  c10::ScalarType reduceType = c10::ScalarType::Float;
  Reduction reduction = Reduction::Sum;
  double preDivide = 1.0, postDivide = 1.0;
  int64_t rows = 0;               // all_slice
  int kernel = -1;                // pointwise: the index in Program::kernels()
};

/// One tensor a generated kernel reads or writes: the sizes and strides it
/// has (checked at each launch for an input, allocated so for an output)
/// and its step in elements along each of the kernel's loop dimensions (0:
/// broadcast there).
struct KernelOperand {
  std::vector<int64_t> shape, strides, steps;
};

/// A generated elementwise kernel (fsdp.pointwise), as the compiler laid it
/// out: `source` defines the element function `name(float in0, ...,
/// float& out0, ...)`; the runtime prints the loop around it from the rest
/// (Kernels.h): loop dimensions innermost first (`extents`), each operand's
/// steps, `vector` elements per thread and iteration, `block` threads,
/// `grid` blocks.
struct KernelSpec {
  std::string name, source;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> extents;
  std::vector<KernelOperand> inputs, outputs;
  int64_t vector = 1, block = 0, grid = 0;
};

struct TensorSpec {
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
};

/// A communication group key: every group of it, as world ranks.
struct GroupSpec {
  std::string key, grid;
  std::vector<int64_t> gridShape, axes;
  int64_t size = 0;
  std::vector<std::vector<int64_t>> members;
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype, unit;
  bool trainable = true;
  /// Its shard, gradient and optimizer state live in host memory.
  bool offloaded = false;
  /// FSDP leaves it alone (FSDP2's ignored_params): whole on every rank,
  /// its gradient this rank's own.
  bool ignored = false;
  std::vector<std::string> tied;
  std::optional<std::string> group; // nullopt: whole on every rank
  int64_t shardRows = 0, padding = 0;
};

struct BufferSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
};

struct Function {
  std::string name;
  bool step = false;
  /// Captured once and replayed as a CUDA graph (fsdp_rt/Replay.h).
  bool cudaGraph = false;
  std::vector<int> inputs;
  std::vector<TensorSpec> inputTypes;
  int slots = 0, futures = 0;
  std::vector<Instruction> instructions;
};

class ReplayedSteps;

class Program {
public:
  /// Parses and prepares a program for `device` (the "<device>" literal).
  /// Throws std::runtime_error naming the instruction and its source line.
  /// Without a device: the program's own device kind (to validate a program
  /// for another machine; nothing is allocated at load).
  /// For a GPU, the program's kernels are compiled and loaded there (cubins
  /// cached in `kernelCache` when it is not empty).
  static Program load(const std::string &text, std::optional<c10::Device> device,
                      const std::string &kernelCache = "");

  const Function &function(const std::string &name) const;
  const std::vector<Function> &functions() const { return functions_; }
  const std::vector<GroupSpec> &groups() const { return groups_; }
  const std::vector<ParamSpec> &params() const { return params_; }
  const std::vector<BufferSpec> &buffers() const { return buffers_; }
  const std::vector<KernelSpec> &kernels() const { return kernels_; }
  /// The kernels loaded on the program's GPU (null on a CPU, or where the
  /// program was loaded for no device).
  const LoadedKernels *loadedKernels() const { return loadedKernels_.get(); }
  /// The CUDA graphs of the functions the program replays (null where it
  /// replays none, or was loaded for no device).
  ReplayedSteps *replays() const { return replays_.get(); }
  c10::Device device() const { return device_; }
  /// The device kind the step was compiled for ("cpu", "cuda").
  const std::string &deviceKind() const { return deviceKind_; }

private:
  explicit Program(c10::Device device) : device_(device) {}
  friend void validateProgram(const Program &program);

  std::vector<GroupSpec> groups_;
  std::vector<ParamSpec> params_;
  std::vector<BufferSpec> buffers_;
  std::vector<KernelSpec> kernels_;
  std::shared_ptr<const LoadedKernels> loadedKernels_;
  std::shared_ptr<ReplayedSteps> replays_;
  std::vector<Function> functions_;
  c10::Device device_;
  std::string deviceKind_;
};

/// Throws std::runtime_error naming the function, the instruction and the
/// rule when an index, name, shape or future pairing is out of its table.
void validateProgram(const Program &program);

/// The furthest element (in elements from the first) that `extents` with
/// per-dimension `steps` reach; nullopt for a negative step or past 2^63.
std::optional<int64_t> furthestElement(const std::vector<int64_t> &extents, const std::vector<int64_t> &steps);

} // namespace fsdp_rt

#endif // FSDP_RT_PROGRAM_H
