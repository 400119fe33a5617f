//===- ProgramValidation.cpp - check a loaded program before it runs ------===//
//
// The executor indexes its slot and future tables, looks up groups and
// names, and sizes buffers from the program's shapes. This is the one place
// that proves, once at load, that every such index is in its table, every
// name is in the manifest, every shape is a shape, and every future is
// started once and waited for once, in that order, before the function ends
// (ExecuTorch verifies its programs the same way). The executor then needs
// no bounds checks of its own on the hot path.
//
//===----------------------------------------------------------------------===//

#include "fsdp_rt/ElementTypes.h"
#include "fsdp_rt/Program.h"
#include "fsdp_rt/ShardLayout.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <limits>
#include <set>
#include <stdexcept>

namespace fsdp_rt {

namespace {

[[noreturn]] void fail(const std::string &what) { throw std::runtime_error(what); }

/// Elements of `shape`, or an error when a dimension is negative or the
/// product does not fit in int64.
int64_t elementsOf(const std::vector<int64_t> &shape, const std::string &what) {
  int64_t product = 1;
  for (int64_t dim : shape)
    if (dim < 0 || __builtin_mul_overflow(product, dim, &product))
      fail(what + ": shape has a negative dimension or more than 2^63 elements");
  return product;
}

void checkElementType(const std::string &name, const std::string &what) {
  if (!lookupElementType(name))
    fail(what + ": unknown element type '" + name + "'");
}

/// A named tensor of the manifest (parameter or buffer): its name is new
/// among `seen`, its shape and element type valid. Returns how errors name it.
std::string checkTensorEntry(std::set<std::string> &seen, const char *kind, const std::string &name,
                             const std::vector<int64_t> &shape, const std::string &dtype) {
  std::string what = std::string(kind) + " '" + name + "'";
  if (!seen.insert(name).second)
    fail(what + " is listed twice");
  elementsOf(shape, what);
  checkElementType(dtype, what);
  return what;
}

void checkGroup(const GroupSpec &group) {
  std::string what = "group '" + group.key + "'";
  std::optional<int64_t> world = groupSizeOf(group.gridShape.data(), group.gridShape.size());
  if (!world)
    fail(what + ": grid dimensions must be positive");
  if (group.size < 1 || group.members.empty() ||
      static_cast<int64_t>(group.members.size()) * group.size != *world)
    fail(what + ": " + std::to_string(group.members.size()) + " groups of " + std::to_string(group.size) +
         " ranks do not cover the grid's " + std::to_string(*world) + " ranks");
  std::set<int64_t> seen;
  for (const std::vector<int64_t> &members : group.members) {
    if (static_cast<int64_t>(members.size()) != group.size)
      fail(what + ": a group lists " + std::to_string(members.size()) + " ranks, not " +
           std::to_string(group.size));
    for (int64_t rank : members)
      if (rank < 0 || rank >= *world || !seen.insert(rank).second)
        fail(what + ": rank " + std::to_string(rank) + " is outside the grid or in two groups");
  }
  for (int64_t axis : group.axes)
    if (axis < 0 || axis >= static_cast<int64_t>(group.gridShape.size()))
      fail(what + ": axis " + std::to_string(axis) + " is not an axis of the grid");
}

/// `furthestElement`, or an error naming `what`.
int64_t furthestElement(const std::vector<int64_t> &extents, const std::vector<int64_t> &steps,
                        const std::string &what) {
  std::optional<int64_t> furthest = fsdp_rt::furthestElement(extents, steps);
  if (!furthest)
    fail(what + ": a negative step or stride, or an offset past 2^63");
  return *furthest;
}

/// Whether `steps` walk `extents` densely, each element once (sorted by
/// step, each dimension longer than 1 starts where the inner ones end).
bool dense(const std::vector<int64_t> &extents, const std::vector<int64_t> &steps) {
  std::vector<size_t> order;
  for (size_t d = 0; d < extents.size(); ++d)
    if (extents[d] != 1)
      order.push_back(d);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return steps[a] < steps[b]; });
  int64_t expected = 1;
  for (size_t d : order) {
    if (steps[d] != expected)
      return false;
    expected *= extents[d];
  }
  return true;
}

/// One tensor of a kernel: its steps stay inside its sizes and strides (so
/// the loop reads or writes nothing outside the tensor the launch checks or
/// allocates); an output is dense and written whole, each element once.
void checkKernelOperand(const KernelOperand &operand, const KernelSpec &kernel, int64_t elements,
                        const std::string &what) {
  if (operand.strides.size() != operand.shape.size())
    fail(what + ": " + std::to_string(operand.shape.size()) + " sizes and " + std::to_string(operand.strides.size()) +
         " strides");
  if (operand.steps.size() != kernel.extents.size())
    fail(what + ": " + std::to_string(operand.steps.size()) + " steps for " + std::to_string(kernel.extents.size()) +
         " loop dimensions");
  int64_t tensorElements = elementsOf(operand.shape, what);
  if (tensorElements == 0 || elements == 0)
    fail(what + ": a kernel over no elements");
  int64_t reach = furthestElement(kernel.extents, operand.steps, what);
  int64_t extent = furthestElement(operand.shape, operand.strides, what);
  if (reach > extent)
    fail(what + ": the loop reaches element " + std::to_string(reach) + ", past the tensor's last (" +
         std::to_string(extent) + ")");
}

/// A generated kernel: the element function under an identifier, 1 to
/// kMostKernelTensors tensors of one kernel element type in and out, a
/// loop that stays inside every tensor and writes each output element once,
/// a vector width that divides the innermost dimension and fits 16 bytes,
/// and a launch CUDA accepts.
void checkKernel(const KernelSpec &kernel, const std::string &deviceKind, std::set<std::string> &names) {
  std::string what = "kernel '" + kernel.name + "'";
  if (deviceKind != "cuda")
    fail(what + ": generated kernels run on cuda, and the program is for " + deviceKind);
  bool identifier = !kernel.name.empty() && !std::isdigit(static_cast<unsigned char>(kernel.name[0])) &&
                    std::all_of(kernel.name.begin(), kernel.name.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                    });
  if (!identifier)
    fail(what + ": the name is not a C++ identifier");
  if (!names.insert(kernel.name).second)
    fail(what + " is listed twice");
  constexpr size_t most = kMostKernelTensors;
  if (kernel.inputs.empty() || kernel.inputs.size() > most || kernel.outputs.empty() || kernel.outputs.size() > most)
    fail(what + " takes " + std::to_string(kernel.inputs.size()) + " tensors and makes " +
         std::to_string(kernel.outputs.size()) + "; a kernel takes and makes 1 to 8");
  if (kernel.source.find(kernel.name) == std::string::npos)
    fail(what + ": the source does not define it");
  if (kernel.dtype != c10::ScalarType::Float && kernel.dtype != c10::ScalarType::BFloat16 &&
      kernel.dtype != c10::ScalarType::Half)
    fail(what + ": computes in " + elementTypeOf(kernel.dtype) + "; kernels compute f32, bf16 or f16");
  if (kernel.extents.empty() || kernel.extents.size() > kMostKernelDimensions)
    fail(what + ": " + std::to_string(kernel.extents.size()) + " loop dimensions; a kernel has 1 to " +
         std::to_string(kMostKernelDimensions));
  int64_t elements = elementsOf(kernel.extents, what);
  int64_t bytes = static_cast<int64_t>(c10::elementSize(kernel.dtype));
  bool power = kernel.vector > 0 && (kernel.vector & (kernel.vector - 1)) == 0;
  if (!power || kernel.vector * bytes > 16 || kernel.extents.front() % kernel.vector != 0)
    fail(what + ": vector width " + std::to_string(kernel.vector) +
         " is not a power of two of at most 16 bytes that divides the innermost loop dimension (" +
         std::to_string(kernel.extents.front()) + ")");
  if (kernel.block < 32 || kernel.block > 1024 || kernel.block % 32 != 0 || kernel.grid < 1 ||
      kernel.grid > std::numeric_limits<int32_t>::max())
    fail(what + ": launches " + std::to_string(kernel.grid) + " blocks of " + std::to_string(kernel.block) +
         " threads; a block is 32 to 1024 threads in whole warps, a grid 1 to 2^31-1 blocks");
  // More threads than iterations could step the loop's index past its
  // 32-bit range (the kernel narrows it where the tensors allow).
  int64_t needed = std::max<int64_t>(1, (elements / kernel.vector + kernel.block - 1) / kernel.block);
  if (kernel.grid > needed)
    fail(what + ": launches " + std::to_string(kernel.grid) + " blocks of " + std::to_string(kernel.block) +
         " threads for " + std::to_string(elements / kernel.vector) + " iterations, which need at most " +
         std::to_string(needed));
  for (size_t i = 0; i < kernel.inputs.size(); ++i)
    checkKernelOperand(kernel.inputs[i], kernel, elements, what + " input " + std::to_string(i));
  for (size_t i = 0; i < kernel.outputs.size(); ++i) {
    const KernelOperand &output = kernel.outputs[i];
    std::string where = what + " output " + std::to_string(i);
    checkKernelOperand(output, kernel, elements, where);
    if (elementsOf(output.shape, where) != elements || !dense(kernel.extents, output.steps) ||
        !dense(output.shape, output.strides))
      fail(where + ": not written densely, each of its elements once");
  }
}

class FunctionValidator {
public:
  FunctionValidator(const Function &function, const std::map<std::string, const GroupSpec *> &groups,
                    const std::set<std::string> &params, const std::map<std::string, std::string> &offloaded,
                    const std::set<std::string> &buffers, const std::vector<KernelSpec> &kernels)
      : function(function), groups(groups), params(params), offloaded(offloaded), buffers(buffers),
        kernels(kernels), defined(function.slots, false), startedBy(function.futures, nullptr) {}

  void run() {
    if (function.inputs.size() != function.inputTypes.size())
      fail(std::to_string(function.inputs.size()) + " inputs but " + std::to_string(function.inputTypes.size()) +
           " input types");
    size_t results = function.inputs.size(), starts = 0;
    for (const Instruction &inst : function.instructions) {
      results += inst.results.size();
      starts += isCollectiveStart(inst.kind);
    }
    // Every slot is written by an input or a result, every future by a start:
    // larger tables are damage (and would be allocated before anything runs).
    if (static_cast<size_t>(function.slots) > results || static_cast<size_t>(function.futures) > starts)
      fail(std::to_string(function.slots) + " slots and " + std::to_string(function.futures) +
           " futures, but the instructions define only " + std::to_string(results) + " and " +
           std::to_string(starts));
    for (size_t i = 0; i < function.inputs.size(); ++i) {
      elementsOf(function.inputTypes[i].shape, "input " + std::to_string(i));
      write(function.inputs[i], "input");
    }
    for (size_t i = 0; i < function.instructions.size(); ++i) {
      try {
        current = &function.instructions[i];
        check(function.instructions[i]);
      } catch (const std::exception &error) {
        const Instruction &inst = function.instructions[i];
        fail("instruction " + std::to_string(i) + " (" + inst.name +
             (inst.where.empty() ? "" : " at " + inst.where) + "): " + error.what());
      }
    }
    for (int future = 0; future < function.futures; ++future)
      if (startedBy[future])
        fail("future " + std::to_string(future) + " (" + startedBy[future]->name + ") is never waited for");
  }

private:
  void read(int slot) {
    if (slot < 0 || slot >= function.slots)
      fail("reads slot " + std::to_string(slot) + ", outside the function's " + std::to_string(function.slots));
    if (!defined[slot])
      fail("reads slot " + std::to_string(slot) + " before anything writes it");
    // The host optimizer may be updating an offloaded shard while the step
    // runs; only its unit's host all-gather waits for that update.
    if (auto shard = hostShards.find(slot); shard != hostShards.end()) {
      const auto &[name, unit] = *shard->second;
      bool gathersIt = current->kind == Instruction::Kind::AllGather && current->host && current->unit == unit;
      if (!gathersIt && current->kind != Instruction::Kind::Release)
        fail("reads the offloaded parameter '" + name + "'; only a host all_gather of its unit @" + unit + " may");
    }
  }

  void write(int slot, const char *what, bool mayDiscard = false) {
    if (mayDiscard && slot == -1)
      return;
    if (slot < 0 || slot >= function.slots)
      fail(std::string(what) + " writes slot " + std::to_string(slot) + ", outside the function's " +
           std::to_string(function.slots));
    defined[slot] = true;
    hostShards.erase(slot);
  }

  void arity(const Instruction &inst, size_t inputs, size_t results) {
    if (inst.inputs.size() != inputs || inst.results.size() != results)
      fail("takes " + std::to_string(inst.inputs.size()) + " values and writes " +
           std::to_string(inst.results.size()) + "; " + opNameText(inst) + " takes " + std::to_string(inputs) +
           " and writes " + std::to_string(results));
  }

  static std::string opNameText(const Instruction &inst) { return std::string(opName(inst.kind)); }

  void named(const std::set<std::string> &table, const std::string &name, const char *what) {
    if (!table.count(name))
      fail("names the " + std::string(what) + " '" + name + "', which the manifest does not list");
  }

  const GroupSpec &group(const std::string &key) {
    auto it = groups.find(key);
    if (it == groups.end())
      fail("names the group '" + key + "', which the manifest does not list");
    return *it->second;
  }

  void check(const Instruction &inst) {
    using Kind = Instruction::Kind;
    switch (inst.kind) {
    case Kind::Param:
    case Kind::AccumulatedGrad:
    case Kind::Buffer:
      arity(inst, 0, 1);
      named(inst.kind == Kind::Buffer ? buffers : params, inst.name,
            inst.kind == Kind::Buffer ? "buffer" : "parameter");
      write(inst.results[0], "the result");
      if (auto entry = offloaded.find(inst.name); inst.kind == Kind::Param && entry != offloaded.end())
        hostShards[inst.results[0]] = &*entry;
      return;
    case Kind::Aten:
      for (const AtenArgument &arg : inst.args)
        for (int slot : arg.slots)
          if (!(slot == -1 && arg.kind == AtenArgument::Kind::OptionalTensorList))
            read(slot);
      for (int slot : inst.results)
        write(slot, "a result", /*mayDiscard=*/true);
      return;
    case Kind::Cast:
      arity(inst, 1, 1);
      if (inst.dtypes.size() != 1)
        fail("a cast has one target dtype");
      read(inst.inputs[0]);
      write(inst.results[0], "the result");
      return;
    case Kind::Loss:
      arity(inst, 1, 0);
      read(inst.inputs[0]);
      return;
    case Kind::Gradients:
      if (inst.params.size() != inst.inputs.size() || !inst.results.empty())
        fail("gradients pairs each value with one parameter");
      for (size_t i = 0; i < inst.inputs.size(); ++i) {
        read(inst.inputs[i]);
        named(params, inst.params[i], "parameter");
      }
      return;
    case Kind::AllGather:
    case Kind::ReduceScatter:
    case Kind::AllReduce:
      return checkStart(inst);
    case Kind::Wait:
      return checkWait(inst);
    case Kind::Release:
    case Kind::Reshard:
    case Kind::Return:
      if (!inst.results.empty())
        fail(opNameText(inst) + " writes no slots");
      for (int slot : inst.inputs)
        read(slot);
      return;
    case Kind::Pointwise: {
      if (inst.kernel < 0 || inst.kernel >= static_cast<int>(kernels.size()))
        fail("kernel " + std::to_string(inst.kernel) + " is outside the program's " +
             std::to_string(kernels.size()));
      const KernelSpec &kernel = kernels[inst.kernel];
      arity(inst, static_cast<int>(kernel.inputs.size()), static_cast<int>(kernel.outputs.size()));
      for (int slot : inst.inputs)
        read(slot);
      for (int slot : inst.results)
        write(slot, "a result");
      return;
    }
    case Kind::AllSlice:
      arity(inst, 1, 1);
      group(inst.group);
      if (inst.rows < 0)
        fail("negative rows");
      read(inst.inputs[0]);
      write(inst.results[0], "the result");
      return;
    }
    fail("unknown instruction kind");
  }

  void checkStart(const Instruction &inst) {
    if (inst.inputs.empty() || !inst.results.empty())
      fail(opNameText(inst) + " takes one or more values and writes its future, not slots");
    if (inst.shapes.size() != inst.inputs.size() || inst.dtypes.size() != inst.inputs.size())
      fail("inputs, shapes and dtypes differ in number");
    group(inst.group);
    if (inst.intoResults && inst.host)
      fail("a host all_gather gathers through a receive buffer, not into its results");
    if (inst.kind == Instruction::Kind::AllGather && inst.host && landedUnits.count(inst.unit))
      fail("gathers unit @" + inst.unit + "'s shards after its gradients landed in host memory, where its "
           "optimizer may already be stepping them");
    int64_t total = 0;
    for (size_t i = 0; i < inst.inputs.size(); ++i) {
      read(inst.inputs[i]);
      std::string what = "shape " + std::to_string(i);
      int64_t elements = elementsOf(inst.shapes[i], what);
      if (inst.kind != Instruction::Kind::AllReduce && inst.shapes[i].empty())
        fail(what + " is a scalar; " + opNameText(inst) + " splits dim 0");
      if (__builtin_add_overflow(total, elements, &total))
        fail("the bucket has more than 2^63 elements");
    }
    if (inst.future < 0 || inst.future >= function.futures)
      fail("future " + std::to_string(inst.future) + " is outside the function's " +
           std::to_string(function.futures));
    if (startedBy[inst.future])
      fail("future " + std::to_string(inst.future) + " is started again before its wait");
    startedBy[inst.future] = &inst;
  }

  void checkWait(const Instruction &inst) {
    if (inst.future < 0 || inst.future >= function.futures)
      fail("future " + std::to_string(inst.future) + " is outside the function's " +
           std::to_string(function.futures));
    const Instruction *start = startedBy[inst.future];
    if (!start)
      fail("waits for future " + std::to_string(inst.future) + ", which is not in flight");
    if (inst.results.size() != start->shapes.size())
      fail("takes " + std::to_string(inst.results.size()) + " results from a collective of " +
           std::to_string(start->shapes.size()));
    startedBy[inst.future] = nullptr;
    for (int slot : inst.results)
      write(slot, "a result", /*mayDiscard=*/true);
    checkLanding(inst, *start);
  }

  /// A host reduction's wait names the parameter of each gradient it lands
  /// (the host optimizer may step them from there): offloaded parameters of
  /// the reduction's unit, each landed once.
  void checkLanding(const Instruction &wait, const Instruction &start) {
    bool hostReduction = start.host && start.kind != Instruction::Kind::AllGather;
    if (!hostReduction) {
      if (!wait.params.empty())
        fail("names the gradients it lands, but waits for a collective that does not deliver to host memory");
      return;
    }
    if (wait.params.size() != wait.results.size())
      fail("lands " + std::to_string(wait.results.size()) + " results in host memory but names " +
           std::to_string(wait.params.size()) + " gradients");
    for (const Instruction *inFlight : startedBy)
      if (inFlight && inFlight->kind == Instruction::Kind::AllGather && inFlight->host && inFlight->unit == start.unit)
        fail("lands unit @" + start.unit + "'s gradients while its all-gather is in flight, whose copy-in may "
             "still read the shards its optimizer steps");
    landedUnits.insert(start.unit);
    for (const std::string &name : wait.params) {
      if (name.empty())
        continue;
      auto entry = offloaded.find(name);
      if (entry == offloaded.end() || entry->second != start.unit)
        fail("lands a gradient of '" + name + "', which is not an offloaded parameter of unit @" + start.unit);
      if (!landedParams.insert(name).second)
        fail("lands the gradient of '" + name + "' a second time");
    }
  }

  const Function &function;
  const std::map<std::string, const GroupSpec *> &groups;
  const std::set<std::string> &params;
  const std::map<std::string, std::string> &offloaded; // parameter -> its unit
  const std::set<std::string> &buffers;
  const std::vector<KernelSpec> &kernels;
  const Instruction *current = nullptr;
  std::map<int, const std::pair<const std::string, std::string> *> hostShards; // slot -> offloaded parameter
  std::vector<bool> defined;
  std::vector<const Instruction *> startedBy;
  std::set<std::string> landedUnits, landedParams; // gradients in host memory so far
};

/// A function the program replays as a CUDA graph: a CUDA training step
/// whose every input but the batch is the same tensor on every call, with
/// no work on host threads (the rules of fsdp-cuda-graph).
void checkReplayable(const Function &function, const std::string &deviceKind) {
  if (deviceKind != "cuda")
    fail("it is replayed as a CUDA graph, which needs a cuda program; this one is for " + deviceKind);
  if (!function.step)
    fail("it is replayed as a CUDA graph but is not a training step");
  for (size_t i = 0; i < function.instructions.size(); ++i) {
    const Instruction &inst = function.instructions[i];
    if (inst.host)
      fail("it is replayed as a CUDA graph, but instruction " + std::to_string(i) + " (" + inst.name +
           ") moves an offloaded unit's tensors through host memory");
    if (inst.kind == Instruction::Kind::AccumulatedGrad)
      fail("it is replayed as a CUDA graph, but instruction " + std::to_string(i) +
           " reads an accumulated gradient, new on every call");
  }
}

} // namespace

std::optional<int64_t> furthestElement(const std::vector<int64_t> &extents, const std::vector<int64_t> &steps) {
  int64_t furthest = 0, term = 0;
  for (size_t d = 0; d < extents.size(); ++d)
    if (steps[d] < 0 || __builtin_mul_overflow(extents[d] - 1, steps[d], &term) ||
        __builtin_add_overflow(furthest, term, &furthest))
      return std::nullopt;
  return furthest;
}

void validateProgram(const Program &program) {
  std::map<std::string, const GroupSpec *> groups;
  std::set<std::string> params, buffers, functions;
  std::map<std::string, std::string> offloaded;
  try {
    for (const GroupSpec &group : program.groups()) {
      checkGroup(group);
      if (!groups.emplace(group.key, &group).second)
        fail("group '" + group.key + "' is listed twice");
    }
    for (const ParamSpec &param : program.params()) {
      std::string what = checkTensorEntry(params, "parameter", param.name, param.shape, param.dtype);
      if (param.offloaded)
        offloaded.emplace(param.name, param.unit);
      if (!param.group) {
        if (param.offloaded)
          fail(what + " is offloaded but replicated; only shards are offloaded");
        continue;
      }
      auto it = groups.find(*param.group);
      if (it == groups.end())
        fail(what + ": no group '" + *param.group + "'");
      if (param.shape.empty())
        fail(what + " is a scalar; only replicated parameters (group null) may be");
      auto layout = Dim0ShardLayout::create(param.shape[0], it->second->size);
      if (!layout || layout->shardRows() != param.shardRows || layout->paddingRows() != param.padding)
        fail(what + ": shard_rows " + std::to_string(param.shardRows) + " and padding " +
             std::to_string(param.padding) + " are not the layout of " + std::to_string(param.shape[0]) +
             " rows over " + std::to_string(it->second->size) + " ranks");
    }
    for (const BufferSpec &buffer : program.buffers())
      checkTensorEntry(buffers, "buffer", buffer.name, buffer.shape, buffer.dtype);
    std::set<std::string> kernelNames;
    for (const KernelSpec &kernel : program.kernels())
      checkKernel(kernel, program.deviceKind(), kernelNames);
  } catch (const std::exception &error) {
    throw std::runtime_error(std::string("fsdp_rt: invalid program manifest: ") + error.what());
  }
  for (const Function &function : program.functions()) {
    try {
      if (!functions.insert(function.name).second)
        fail("the function is defined twice");
      FunctionValidator(function, groups, params, offloaded, buffers, program.kernels()).run();
      if (function.cudaGraph)
        checkReplayable(function, program.deviceKind());
    } catch (const std::exception &error) {
      throw std::runtime_error("fsdp_rt: invalid program: @" + function.name + ": " + error.what());
    }
  }
}

} // namespace fsdp_rt
