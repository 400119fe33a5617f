//===- Step.h - what generated step code calls ------------------*- C++ -*-===//
//
// fsdp-translate --fsdp-to-cpp writes one C++ function per training step that
// calls this interface: parameter shards and buffers from the Python driver,
// asynchronous collectives with FSDP's padding layout, and ATen operators by
// schema name through the boxed dispatcher. Light on purpose: ATen and
// c10d's ProcessGroup only, so generated files compile quickly.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_STEP_H
#define FSDP_RT_STEP_H

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fsdp_rt {

enum class Reduction { Sum, Average, Max, Min, Product };

/// A collective in flight, returned by a *_start and consumed by wait.
struct Pending {
  size_t id;
};

struct StepResult {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
};

/// State of one step call: the rank's shards, buffers, groups, and the
/// collectives in flight. Errors name the rank, the collective and its group.
class StepContext {
public:
  StepContext(std::map<std::string, at::Tensor> params, std::map<std::string, at::Tensor> buffers,
              std::map<std::string, at::Tensor> accumulated,
              std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> groups,
              std::chrono::milliseconds timeout, c10::Device device);

  at::Tensor param(const std::string &name) const;
  at::Tensor buffer(const std::string &name) const;
  at::Tensor accumulatedGrad(const std::string &name) const;
  c10::Device device() const { return device_; }

  /// Gathers padded dim-0 shards into full tensors of `fullShapes`, sent as `wire`.
  Pending allGather(const std::string &group, const std::vector<at::Tensor> &shards,
                    const std::vector<std::vector<int64_t>> &fullShapes, at::ScalarType wire);
  /// Reduces full tensors and keeps this rank's padded shard of each.
  Pending reduceScatter(const std::string &group, const std::vector<at::Tensor> &inputs,
                        const std::vector<std::vector<int64_t>> &shardShapes,
                        const std::vector<at::ScalarType> &resultTypes, at::ScalarType reduceType,
                        Reduction reduction, double preDivide, double postDivide);
  /// Reduces tensors on every rank of the group.
  Pending allReduce(const std::string &group, const std::vector<at::Tensor> &inputs,
                    const std::vector<std::vector<int64_t>> &shapes,
                    const std::vector<at::ScalarType> &resultTypes, at::ScalarType reduceType,
                    Reduction reduction, double preDivide, double postDivide);
  std::vector<at::Tensor> wait(Pending pending);
  /// This rank's padded dim-0 slice of a full tensor, over `group` (no communication).
  at::Tensor allSlice(const std::string &group, const at::Tensor &full, int64_t rows);

  void setLoss(const at::Tensor &loss) { result_.loss = loss; }
  void setGradients(const std::vector<std::string> &names, const std::vector<at::Tensor> &grads);
  StepResult finish();

private:
  struct InFlight {
    std::string what;
    c10::intrusive_ptr<c10d::Work> work;
    std::function<std::vector<at::Tensor>()> finish;
    bool done = false;
  };
  c10d::ProcessGroup &group(const std::string &key);
  Pending launch(std::string what, c10::intrusive_ptr<c10d::Work> work,
                 std::function<std::vector<at::Tensor>()> finish);
  Pending reduce(const char *kind, const std::string &group, const std::vector<at::Tensor> &inputs,
                 const std::vector<std::vector<int64_t>> &shapes,
                 const std::vector<at::ScalarType> &resultTypes, at::ScalarType reduceType,
                 Reduction reduction, double preDivide, double postDivide, bool scatter);

  std::map<std::string, at::Tensor> params_, buffers_, accumulated_;
  std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> groups_;
  std::chrono::milliseconds timeout_;
  c10::Device device_;
  std::vector<InFlight> inFlight_;
  StepResult result_;
};

/// Calls an ATen operator by schema name; string literals and list types are
/// converted to what the schema expects.
std::vector<c10::IValue> aten(StepContext &ctx, const char *name, const char *overload,
                              std::vector<c10::IValue> args);
/// A string argument whose meaning depends on the schema: a layout, a memory
/// format, "<device>" (the rank's device) or a plain string.
c10::IValue literal(const char *text);
/// A `Tensor?[]` argument.
c10::IValue optionalTensors(std::vector<std::optional<at::Tensor>> tensors);

/// What a generated module exports: its groups and its steps.
using StepFunction = StepResult (*)(StepContext &, const std::vector<at::Tensor> &);
struct GroupSpec {
  std::string key;
  std::vector<int64_t> gridShape;
  std::vector<int16_t> axes;
};
struct StepSpec {
  std::string name;
  StepFunction function;
  std::string collectiveHash;
};
struct ModuleSpec {
  std::vector<GroupSpec> groups;
  std::vector<StepSpec> steps;
};

} // namespace fsdp_rt

/// The generated file's table of groups and steps.
#define FSDP_RT_MODULE(...)                                                                        \
  const fsdp_rt::ModuleSpec &fsdp_rt_module() {                                                    \
    static const fsdp_rt::ModuleSpec spec{__VA_ARGS__};                                            \
    return spec;                                                                                   \
  }

const fsdp_rt::ModuleSpec &fsdp_rt_module();

#endif // FSDP_RT_STEP_H
