//===- Step.cpp - collectives with FSDP's layout, ATen by name ------------===//

#include "fsdp_rt/Step.h"
#include "fsdp_rt/ShardLayout.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace fsdp_rt {

namespace {

[[noreturn]] void fail(const std::string &message) {
  throw std::runtime_error("fsdp_rt: " + message);
}

std::string shapeText(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

c10d::ReduceOp toReduceOp(Reduction reduction) {
  switch (reduction) {
  case Reduction::Max:
    return c10d::ReduceOp::MAX;
  case Reduction::Min:
    return c10d::ReduceOp::MIN;
  case Reduction::Product:
    return c10d::ReduceOp::PRODUCT;
  case Reduction::Sum:
  case Reduction::Average: // summed, then divided: every backend has SUM
    return c10d::ReduceOp::SUM;
  }
  return c10d::ReduceOp::SUM;
}

/// Rows each rank stores for `dim0` rows over `ranks`.
int64_t shardRows(int64_t dim0, int64_t ranks) {
  auto layout = Dim0ShardLayout::create(dim0, ranks);
  if (!layout)
    fail("cannot shard " + std::to_string(dim0) + " rows over " + std::to_string(ranks) + " ranks");
  return layout->shardRows();
}

} // namespace

StepContext::StepContext(std::map<std::string, at::Tensor> params,
                         std::map<std::string, at::Tensor> buffers,
                         std::map<std::string, at::Tensor> accumulated,
                         std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> groups,
                         std::chrono::milliseconds timeout, c10::Device device)
    : params_(std::move(params)), buffers_(std::move(buffers)), accumulated_(std::move(accumulated)),
      groups_(std::move(groups)), timeout_(timeout), device_(device) {}

static at::Tensor lookup(const std::map<std::string, at::Tensor> &table, const std::string &name,
                         const char *what) {
  auto it = table.find(name);
  if (it == table.end())
    fail(std::string("the step reads ") + what + " '" + name + "', which the driver did not pass");
  return it->second;
}

at::Tensor StepContext::param(const std::string &name) const { return lookup(params_, name, "parameter"); }
at::Tensor StepContext::buffer(const std::string &name) const { return lookup(buffers_, name, "buffer"); }
at::Tensor StepContext::accumulatedGrad(const std::string &name) const {
  return lookup(accumulated_, name, "accumulated gradient");
}

c10d::ProcessGroup &StepContext::group(const std::string &key) {
  auto it = groups_.find(key);
  if (it == groups_.end() || !it->second)
    fail("no process group for '" + key + "'; the driver creates one per group the module lists");
  return *it->second;
}

Pending StepContext::launch(std::string what, c10::intrusive_ptr<c10d::Work> work,
                            std::function<std::vector<at::Tensor>()> finish) {
  inFlight_.push_back({std::move(what), std::move(work), std::move(finish)});
  return Pending{inFlight_.size() - 1};
}

Pending StepContext::allGather(const std::string &key, const std::vector<at::Tensor> &shards,
                               const std::vector<std::vector<int64_t>> &fullShapes,
                               at::ScalarType wire) {
  c10d::ProcessGroup &pg = group(key);
  int64_t ranks = pg.getSize();
  std::vector<at::Tensor> flat;
  std::vector<int64_t> numels;
  for (size_t i = 0; i < shards.size(); ++i) {
    int64_t rows = shardRows(fullShapes[i].at(0), ranks);
    if (shards[i].dim() < 1 || shards[i].size(0) != rows)
      fail("all_gather on '" + key + "': input " + std::to_string(i) + " has shape " +
           shapeText(shards[i].sizes()) + ", expected " + std::to_string(rows) + " rows");
    flat.push_back(shards[i].to(wire).contiguous().view(-1));
    numels.push_back(flat.back().numel());
  }
  at::Tensor input = at::cat(flat);
  at::Tensor output = at::empty({ranks * input.numel()}, input.options());
  auto work = pg._allgather_base(output, input);
  std::vector<std::vector<int64_t>> shapes = fullShapes;
  return launch("all_gather on group '" + key + "'", work, [output, numels, shapes, ranks]() {
    std::vector<at::Tensor> full;
    at::Tensor byRank = output.view({ranks, -1});
    int64_t offset = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::vector<int64_t> padded = shapes[i];
      padded[0] = ranks * shardRows(shapes[i][0], ranks);
      // Rank r's columns hold its rows; stacking them gives the padded tensor.
      at::Tensor gathered = byRank.narrow(1, offset, numels[i]).reshape(padded);
      full.push_back(gathered.narrow(0, 0, shapes[i][0]).contiguous());
      offset += numels[i];
    }
    return full;
  });
}

Pending StepContext::reduce(const char *kind, const std::string &key,
                            const std::vector<at::Tensor> &inputs,
                            const std::vector<std::vector<int64_t>> &shapes,
                            const std::vector<at::ScalarType> &resultTypes, at::ScalarType reduceType,
                            Reduction reduction, double preDivide, double postDivide, bool scatter) {
  c10d::ProcessGroup &pg = group(key);
  int64_t ranks = pg.getSize();
  std::vector<at::Tensor> packed;
  std::vector<int64_t> numels;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!scatter) {
      packed.push_back(inputs[i].to(reduceType).contiguous().view({1, -1}));
      numels.push_back(inputs[i].numel());
      continue;
    }
    const at::Tensor &full = inputs[i];
    int64_t rows = shapes[i].at(0);
    if (full.dim() < 1 || rows != shardRows(full.size(0), ranks))
      fail(std::string(kind) + " on '" + key + "': input " + std::to_string(i) + " of shape " +
           shapeText(full.sizes()) + " does not shard into " + std::to_string(rows) + " rows");
    std::vector<int64_t> padded(full.sizes().begin(), full.sizes().end());
    padded[0] = ranks * rows;
    at::Tensor withPadding = at::zeros(padded, full.options().dtype(reduceType));
    withPadding.narrow(0, 0, full.size(0)).copy_(full);
    packed.push_back(withPadding.view({ranks, -1}));
    numels.push_back(withPadding.numel() / ranks);
  }
  // Scatter: row r of the packed buffer is what rank r keeps.
  at::Tensor buffer = at::cat(packed, 1).contiguous();
  if (preDivide != 1.0)
    buffer.div_(preDivide);
  at::Tensor flat = buffer.view(-1);
  at::Tensor output = scatter ? at::empty({buffer.size(1)}, buffer.options()) : flat;
  c10::intrusive_ptr<c10d::Work> work;
  if (scatter) {
    c10d::ReduceScatterOptions options;
    options.reduceOp = toReduceOp(reduction);
    work = pg._reduce_scatter_base(output, flat, options);
  } else {
    c10d::AllreduceOptions options;
    options.reduceOp = toReduceOp(reduction);
    std::vector<at::Tensor> tensors{flat};
    work = pg.allreduce(tensors, options);
  }
  double divide = postDivide * (reduction == Reduction::Average ? ranks : 1);
  return launch(std::string(kind) + " on group '" + key + "'", work,
                [output, numels, shapes, resultTypes, divide]() {
                  if (divide != 1.0)
                    output.div_(divide);
                  std::vector<at::Tensor> results;
                  int64_t offset = 0;
                  for (size_t i = 0; i < shapes.size(); ++i) {
                    results.push_back(output.narrow(0, offset, numels[i])
                                          .view(shapes[i])
                                          .to(resultTypes[i])
                                          .clone());
                    offset += numels[i];
                  }
                  return results;
                });
}

Pending StepContext::reduceScatter(const std::string &key, const std::vector<at::Tensor> &inputs,
                                   const std::vector<std::vector<int64_t>> &shardShapes,
                                   const std::vector<at::ScalarType> &resultTypes,
                                   at::ScalarType reduceType, Reduction reduction, double preDivide,
                                   double postDivide) {
  return reduce("reduce_scatter", key, inputs, shardShapes, resultTypes, reduceType, reduction,
                preDivide, postDivide, /*scatter=*/true);
}

Pending StepContext::allReduce(const std::string &key, const std::vector<at::Tensor> &inputs,
                               const std::vector<std::vector<int64_t>> &shapes,
                               const std::vector<at::ScalarType> &resultTypes,
                               at::ScalarType reduceType, Reduction reduction, double preDivide,
                               double postDivide) {
  return reduce("all_reduce", key, inputs, shapes, resultTypes, reduceType, reduction, preDivide,
                postDivide, /*scatter=*/false);
}

std::vector<at::Tensor> StepContext::wait(Pending pending) {
  InFlight &op = inFlight_.at(pending.id);
  if (op.done)
    fail(op.what + " (collective #" + std::to_string(pending.id) + ") is waited for twice");
  op.done = true;
  try {
    if (!op.work->wait(timeout_))
      fail(op.what + " (collective #" + std::to_string(pending.id) + ") did not complete");
  } catch (const std::exception &error) {
    std::string rank = groups_.empty() ? "?" : std::to_string(groups_.begin()->second->getRank());
    fail(op.what + " (collective #" + std::to_string(pending.id) + ") failed on rank " + rank +
         ": " + error.what());
  }
  return op.finish();
}

at::Tensor StepContext::allSlice(const std::string &key, const at::Tensor &full, int64_t rows) {
  c10d::ProcessGroup &pg = group(key);
  int64_t ranks = pg.getSize();
  std::vector<int64_t> padded(full.sizes().begin(), full.sizes().end());
  padded[0] = ranks * rows;
  at::Tensor withPadding = at::zeros(padded, full.options());
  withPadding.narrow(0, 0, full.size(0)).copy_(full);
  return withPadding.narrow(0, pg.getRank() * rows, rows).clone();
}

void StepContext::setGradients(const std::vector<std::string> &names,
                               const std::vector<at::Tensor> &grads) {
  for (size_t i = 0; i < names.size(); ++i)
    result_.grads[names[i]] = grads[i];
}

StepResult StepContext::finish() {
  for (size_t i = 0; i < inFlight_.size(); ++i)
    if (!inFlight_[i].done)
      fail(inFlight_[i].what + " (collective #" + std::to_string(i) + ") was never waited for");
  return std::move(result_);
}

//===----------------------------------------------------------------------===//
// ATen by schema name
//===----------------------------------------------------------------------===//

c10::IValue literal(const char *text) { return c10::IValue(std::string(text)); }

c10::IValue optionalTensors(std::vector<std::optional<at::Tensor>> tensors) {
  c10::List<std::optional<at::Tensor>> list;
  for (auto &tensor : tensors)
    list.push_back(std::move(tensor));
  return c10::IValue(list);
}

namespace {

c10::IValue convertLiteral(const std::string &text, const c10::TypePtr &type, StepContext &ctx) {
  switch (type->kind()) {
  case c10::TypeKind::LayoutType:
    if (text == "strided")
      return c10::IValue(static_cast<int64_t>(at::kStrided));
    break;
  case c10::TypeKind::MemoryFormatType:
    if (text == "preserve_format")
      return c10::IValue(static_cast<int64_t>(at::MemoryFormat::Preserve));
    if (text == "contiguous_format")
      return c10::IValue(static_cast<int64_t>(at::MemoryFormat::Contiguous));
    if (text == "channels_last")
      return c10::IValue(static_cast<int64_t>(at::MemoryFormat::ChannelsLast));
    break;
  case c10::TypeKind::DeviceObjType:
    if (text == "<device>")
      return c10::IValue(ctx.device());
    break;
  default:
    return c10::IValue(text);
  }
  fail("cannot use '" + text + "' as " + type->str());
}

/// Adapts an argument to the schema's type: literals, int-for-float, lists.
c10::IValue normalize(c10::IValue value, c10::TypePtr type, StepContext &ctx) {
  if (auto optional = type->cast<c10::OptionalType>()) {
    if (value.isNone())
      return value;
    type = optional->getElementType();
  }
  if (value.isString())
    return convertLiteral(value.toStringRef(), type, ctx);
  if (value.isInt() && type->kind() == c10::TypeKind::FloatType)
    return c10::IValue(static_cast<double>(value.toInt()));
  // A Python number where the schema wants a Tensor (`x / 8.0` traces as
  // div.Tensor): a wrapped number, which like in eager does not promote dtype.
  if ((value.isDouble() || value.isInt() || value.isBool()) &&
      type->kind() == c10::TypeKind::TensorType) {
    at::Tensor number = at::scalar_to_tensor(value.toScalar());
    number.unsafeGetTensorImpl()->set_wrapped_number(true);
    return c10::IValue(number);
  }
  if (auto list = type->cast<c10::ListType>()) {
    auto element = list->getElementType();
    if (value.isTensorList() && element->kind() == c10::TypeKind::OptionalType) {
      c10::List<std::optional<at::Tensor>> optional;
      for (const at::Tensor &tensor : value.toTensorVector())
        optional.push_back(tensor);
      return c10::IValue(optional);
    }
    if (value.isIntList() && value.toIntList().empty() &&
        element->kind() == c10::TypeKind::TensorType)
      return c10::IValue(std::vector<at::Tensor>{});
  }
  return value;
}

} // namespace

std::vector<c10::IValue> aten(StepContext &ctx, const char *name, const char *overload,
                              std::vector<c10::IValue> args) {
  static std::unordered_map<std::string, c10::OperatorHandle> handles;
  std::string key = std::string(name) + "." + overload;
  auto it = handles.find(key);
  if (it == handles.end()) {
    auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!handle)
      fail(std::string("no ATen operator ") + name + (*overload ? "." : "") + overload +
           " in this PyTorch build");
    it = handles.emplace(key, *handle).first;
  }
  const auto &arguments = it->second.schema().arguments();
  if (arguments.size() != args.size())
    fail(key + ": the step passes " + std::to_string(args.size()) + " arguments, the schema has " +
         std::to_string(arguments.size()) + " (captured with a different PyTorch?)");
  torch::jit::Stack stack;
  stack.reserve(args.size());
  try {
    for (size_t i = 0; i < args.size(); ++i)
      stack.push_back(normalize(std::move(args[i]), arguments[i].real_type(), ctx));
    it->second.callBoxed(&stack);
  } catch (const std::exception &error) {
    fail(key + " failed: " + error.what());
  }
  // A `Tensor[]` result (split, unbind) is captured as one result per tensor.
  std::vector<c10::IValue> results;
  for (c10::IValue &value : stack) {
    if (value.isTensorList())
      for (const at::Tensor &tensor : value.toTensorVector())
        results.emplace_back(tensor);
    else
      results.push_back(std::move(value));
  }
  return results;
}

} // namespace fsdp_rt
