//===- Program.cpp - load a program: resolve operators, convert literals --===//

#include "fsdp_rt/Program.h"
#include "fsdp_rt/Kernels.h"
#include "fsdp_rt/ElementTypes.h"
#include "fsdp_rt/ProgramFormat.h"
#include "fsdp_rt/Replay.h"

#include <ATen/ScalarOps.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace fsdp_rt {

c10::ScalarType scalarTypeOf(const std::string &name) {
  std::optional<ElementTypeInfo> info = lookupElementType(name);
  if (!info)
    throw std::runtime_error("unknown element type '" + name + "'");
  switch (info->type) {
  case ElementType::F32: return c10::ScalarType::Float;
  case ElementType::F64: return c10::ScalarType::Double;
  case ElementType::F16: return c10::ScalarType::Half;
  case ElementType::BF16: return c10::ScalarType::BFloat16;
  case ElementType::I64: return c10::ScalarType::Long;
  case ElementType::I32: return c10::ScalarType::Int;
  case ElementType::I16: return c10::ScalarType::Short;
  case ElementType::I8: return c10::ScalarType::Char;
  case ElementType::U64: return c10::ScalarType::UInt64;
  case ElementType::U8: return c10::ScalarType::Byte;
  case ElementType::Bool: return c10::ScalarType::Bool;
  case ElementType::Complex64: return c10::ScalarType::ComplexFloat;
  case ElementType::Complex128: return c10::ScalarType::ComplexDouble;
  case ElementType::F8E4M3FN: return c10::ScalarType::Float8_e4m3fn;
  case ElementType::F8E5M2: return c10::ScalarType::Float8_e5m2;
  }
  throw std::runtime_error("unhandled element type '" + name + "'");
}

std::string elementTypeOf(c10::ScalarType type) {
  for (const ElementTypeInfo &info : kElementTypes)
    if (scalarTypeOf(std::string(info.name)) == type)
      return std::string(info.name);
  throw std::runtime_error(std::string("no element type for ") + c10::toString(type));
}

namespace {

/// `device` with an index: "cuda" is the calling thread's current CUDA device,
/// as tensors made there say (a tensor on cuda:0 is not on "cuda"). Without a
/// device of that kind (validating a CUDA program on a CPU machine) it stays
/// as given.
c10::Device withIndex(c10::Device device) {
  if (device.has_index() || device.is_cpu() || !c10::impl::hasDeviceGuardImpl(device.type()))
    return device;
  const c10::impl::DeviceGuardImplInterface *impl = c10::impl::getDeviceGuardImpl(device.type());
  return impl->deviceCount() > 0 ? impl->getDevice() : device;
}

using json::Value;

/// A slot, future or count: an int that fits, or an error (a narrowing cast
/// could turn 2^32 into slot 0). Validation checks it against its table.
int index(const Value &value) {
  int64_t number = value.asInt();
  if (number < std::numeric_limits<int>::min() || number > std::numeric_limits<int>::max())
    throw std::runtime_error("index " + std::to_string(number) + " is out of range");
  return static_cast<int>(number);
}

int count(const Value &value, const char *what) {
  int number = index(value);
  if (number < 0)
    throw std::runtime_error(std::string(what) + " must not be negative, got " + std::to_string(number));
  return number;
}

std::vector<int> slotList(const Value &value) {
  std::vector<int> out;
  for (const Value &item : value.asArray())
    out.push_back(item.isNull() ? -1 : index(item));
  return out;
}

std::vector<int64_t> intList(const Value &value) {
  std::vector<int64_t> out;
  for (const Value &item : value.asArray())
    out.push_back(item.asInt());
  return out;
}

double realNumber(const Value &value) {
  if (value.kind() == Value::Kind::String) {
    const std::string &text = value.asString();
    if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (text == "inf") return std::numeric_limits<double>::infinity();
    if (text == "-inf") return -std::numeric_limits<double>::infinity();
    throw std::runtime_error("'" + text + "' is not a number");
  }
  return value.asDouble();
}

c10::IValue stringLiteral(const std::string &text, const c10::TypePtr &type, c10::Device device) {
  switch (type->kind()) {
  case c10::TypeKind::LayoutType:
    if (text == "strided") return c10::IValue(static_cast<int64_t>(at::kStrided));
    if (text == "sparse_coo") return c10::IValue(static_cast<int64_t>(at::kSparse));
    break;
  case c10::TypeKind::MemoryFormatType:
    if (text == "preserve_format") return c10::IValue(static_cast<int64_t>(at::MemoryFormat::Preserve));
    if (text == "contiguous_format") return c10::IValue(static_cast<int64_t>(at::MemoryFormat::Contiguous));
    if (text == "channels_last") return c10::IValue(static_cast<int64_t>(at::MemoryFormat::ChannelsLast));
    if (text == "channels_last_3d") return c10::IValue(static_cast<int64_t>(at::MemoryFormat::ChannelsLast3d));
    break;
  case c10::TypeKind::DeviceObjType:
    if (text == "<device>") return c10::IValue(device);
    return c10::IValue(c10::Device(text));
  case c10::TypeKind::StringType:
    return c10::IValue(text);
  default:
    break;
  }
  throw std::runtime_error("'" + text + "' is not a valid " + type->str());
}

/// A scalar literal (bool, int, float) as `type` wants it.
c10::IValue scalarLiteral(const Value &literal, const c10::TypePtr &type) {
  bool isBool = literal.find("bool") != nullptr;
  bool isFloat = literal.find("float") != nullptr;
  switch (type->kind()) {
  case c10::TypeKind::BoolType:
    if (isBool) return c10::IValue(literal.at("bool").asBool());
    break;
  case c10::TypeKind::IntType:
  case c10::TypeKind::SymIntType:
    if (!isBool && !isFloat) return c10::IValue(literal.at("int").asInt());
    break;
  case c10::TypeKind::FloatType:
  case c10::TypeKind::SymFloatType:
    if (isFloat) return c10::IValue(realNumber(literal.at("float")));
    if (!isBool) return c10::IValue(static_cast<double>(literal.at("int").asInt()));
    break;
  case c10::TypeKind::NumberType: // Scalar: keeps its kind, as in eager
    if (isBool) return c10::IValue(literal.at("bool").asBool());
    if (isFloat) return c10::IValue(realNumber(literal.at("float")));
    return c10::IValue(literal.at("int").asInt());
  case c10::TypeKind::TensorType: {
    // A Python number where the schema wants a Tensor (`x / 8.0` traces as
    // div.Tensor): a wrapped number, which like in eager does not promote.
    at::Scalar scalar = isBool ? at::Scalar(literal.at("bool").asBool())
                        : isFloat ? at::Scalar(realNumber(literal.at("float")))
                                  : at::Scalar(literal.at("int").asInt());
    at::Tensor number = at::scalar_to_tensor(scalar);
    number.unsafeGetTensorImpl()->set_wrapped_number(true);
    return c10::IValue(number);
  }
  default:
    break;
  }
  throw std::runtime_error(std::string(isBool ? "a bool" : isFloat ? "a float" : "an int") +
                           " literal cannot be a " + type->str());
}

/// A list literal (ints, floats, bools) as the list type `type` wants it.
c10::IValue listLiteral(const Value &literal, const c10::ListTypePtr &type) {
  const c10::TypePtr &element = type->getElementType();
  const Value *items = literal.find("ints");
  if (!items) items = literal.find("floats");
  if (!items) items = literal.find("bools");
  const json::Array &values = items->asArray();
  switch (element->kind()) {
  case c10::TypeKind::IntType:
  case c10::TypeKind::SymIntType: {
    if (!literal.find("ints")) break;
    c10::List<int64_t> out;
    for (const Value &v : values) out.push_back(v.asInt());
    return c10::IValue(out);
  }
  case c10::TypeKind::FloatType: {
    if (literal.find("bools")) break;
    c10::List<double> out;
    for (const Value &v : values) out.push_back(realNumber(v));
    return c10::IValue(out);
  }
  case c10::TypeKind::BoolType: {
    if (!literal.find("bools") && !values.empty()) break;
    c10::List<bool> out;
    for (const Value &v : values) out.push_back(v.asBool());
    return c10::IValue(out);
  }
  case c10::TypeKind::TensorType:
    if (values.empty()) return c10::IValue(c10::List<at::Tensor>());
    break;
  case c10::TypeKind::OptionalType:
    if (values.empty()) return c10::IValue(c10::List<std::optional<at::Tensor>>());
    break;
  default:
    break;
  }
  throw std::runtime_error("this list literal cannot be a " + type->str());
}

AtenArgument convertArgument(const Value &literal, const c10::Argument &schema, c10::Device device) {
  AtenArgument out;
  c10::TypePtr type = schema.real_type();
  if (literal.isNull()) {
    // An absent tensor where the schema wants one is the undefined tensor:
    // what a fused kernel returns for outputs it does not compute (flash
    // attention's cumulative sequence lengths on dense inputs) and its
    // backward takes back, as autograd passes them.
    if (type->kind() == c10::TypeKind::TensorType) {
      out.constant = c10::IValue(at::Tensor());
      return out;
    }
    if (type->kind() != c10::TypeKind::OptionalType && type->kind() != c10::TypeKind::NoneType)
      throw std::runtime_error("None for the non-optional " + type->str());
    return out; // a None constant
  }
  if (auto optional = type->cast<c10::OptionalType>())
    type = optional->getElementType();
  if (const Value *slot = literal.find("tensor")) {
    out.kind = AtenArgument::Kind::Tensor;
    out.slots = {index(*slot)};
    return out;
  }
  if (const Value *slots = literal.find("tensors")) {
    auto list = type->cast<c10::ListType>();
    if (!list)
      throw std::runtime_error("a tensor list cannot be a " + type->str());
    out.kind = list->getElementType()->kind() == c10::TypeKind::OptionalType
                   ? AtenArgument::Kind::OptionalTensorList
                   : AtenArgument::Kind::TensorList;
    out.slots = slotList(*slots);
    return out;
  }
  if (const Value *text = literal.find("string")) {
    out.constant = stringLiteral(text->asString(), type, device);
    return out;
  }
  if (const Value *dtype = literal.find("dtype")) {
    out.constant = c10::IValue(static_cast<int64_t>(scalarTypeOf(dtype->asString())));
    return out;
  }
  if (auto list = type->cast<c10::ListType>()) {
    if (literal.find("ints") || literal.find("floats") || literal.find("bools")) {
      out.constant = listLiteral(literal, list);
      return out;
    }
    // `int[2] stride=1`: one number stands for the whole fixed-size list.
    if (literal.find("int") && schema.N()) {
      c10::List<int64_t> repeated;
      for (int64_t i = 0; i < *schema.N(); ++i)
        repeated.push_back(literal.at("int").asInt());
      out.constant = c10::IValue(repeated);
      return out;
    }
  }
  if (literal.find("bool") || literal.find("int") || literal.find("float")) {
    out.constant = scalarLiteral(literal, type);
    return out;
  }
  throw std::runtime_error("unrecognised literal for " + type->str());
}

Reduction parseReduction(const std::string &text) {
  if (text == "sum") return Reduction::Sum;
  if (text == "average") return Reduction::Average;
  if (text == "max") return Reduction::Max;
  if (text == "min") return Reduction::Min;
  if (text == "product") return Reduction::Product;
  throw std::runtime_error("unknown reduction '" + text + "'");
}

Instruction::Kind parseKind(const std::string &op) {
  std::optional<InstructionKind> kind = instructionKindOf(op);
  if (!kind)
    throw std::runtime_error("unknown instruction '" + op + "'");
  return *kind;
}

void loadAten(Instruction &inst, const Value &json, c10::Device device) {
  std::string overload = json.at("overload").asString();
  auto handle = c10::Dispatcher::singleton().findSchema({inst.name, overload});
  if (!handle)
    throw std::runtime_error("no ATen operator " + inst.name + (overload.empty() ? "" : ".") +
                             overload + " in this PyTorch build");
  inst.op = *handle;
  const auto &schema = handle->schema().arguments();
  const json::Array &args = json.at("args").asArray();
  // Trailing arguments the program leaves out take their schema defaults.
  bool defaultsCover = args.size() <= schema.size();
  for (size_t i = args.size(); defaultsCover && i < schema.size(); ++i)
    defaultsCover = schema[i].default_value().has_value();
  if (!defaultsCover)
    throw std::runtime_error("the program passes " + std::to_string(args.size()) +
                             " arguments, the schema " + c10::toString(handle->schema()) + " has " +
                             std::to_string(schema.size()) + " (captured with another PyTorch?)");
  for (size_t i = 0; i < args.size(); ++i) {
    try {
      inst.args.push_back(convertArgument(args[i], schema[i], device));
    } catch (const std::exception &error) {
      throw std::runtime_error("argument '" + schema[i].name() + "': " + error.what());
    }
    for (int slot : inst.args.back().slots)
      if (slot >= 0)
        inst.inputs.push_back(slot);
  }
  for (size_t i = args.size(); i < schema.size(); ++i) {
    AtenArgument fallback;
    fallback.constant = *schema[i].default_value();
    inst.args.push_back(std::move(fallback));
  }
  inst.results = slotList(json.at("results"));
}

Instruction loadInstruction(const Value &json, c10::Device device) {
  Instruction inst;
  inst.kind = parseKind(json.at("op").asString());
  if (const Value *where = json.find("loc"))
    inst.where = where->asString();
  switch (inst.kind) {
  case Instruction::Kind::Param:
  case Instruction::Kind::Buffer:
  case Instruction::Kind::AccumulatedGrad:
    inst.name = json.at("name").asString();
    inst.results = {index(json.at("result"))};
    break;
  case Instruction::Kind::Aten:
    inst.name = json.at("name").asString();
    loadAten(inst, json, device);
    break;
  case Instruction::Kind::Cast:
    inst.name = "cast";
    inst.inputs = {index(json.at("input"))};
    inst.dtypes = {scalarTypeOf(json.at("dtype").asString())};
    inst.results = {index(json.at("result"))};
    break;
  case Instruction::Kind::Loss:
    inst.name = "loss";
    inst.inputs = {index(json.at("input"))};
    break;
  case Instruction::Kind::Gradients:
    inst.name = "gradients";
    inst.inputs = slotList(json.at("inputs"));
    for (const Value &param : json.at("params").asArray())
      inst.params.push_back(param.asString());
    if (inst.params.size() != inst.inputs.size())
      throw std::runtime_error("gradients: " + std::to_string(inst.params.size()) + " parameters, " +
                               std::to_string(inst.inputs.size()) + " values");
    break;
  case Instruction::Kind::AllGather:
  case Instruction::Kind::ReduceScatter:
  case Instruction::Kind::AllReduce:
    inst.name = json.at("op").asString();
    inst.group = json.at("group").asString();
    if (const Value *unit = json.find("unit"))
      inst.unit = unit->asString();
    inst.host = json.at("host").asBool();
    if (inst.kind == Instruction::Kind::AllGather)
      inst.intoResults = json.at("into_results").asBool();
    inst.inputs = slotList(json.at("inputs"));
    inst.future = index(json.at("future"));
    for (const Value &shape : json.at("shapes").asArray())
      inst.shapes.push_back(intList(shape));
    for (const Value &dtype : json.at("dtypes").asArray())
      inst.dtypes.push_back(scalarTypeOf(dtype.asString()));
    if (inst.shapes.size() != inst.inputs.size() || inst.dtypes.size() != inst.inputs.size())
      throw std::runtime_error(inst.name + ": inputs, shapes and dtypes differ in number");
    if (inst.kind != Instruction::Kind::AllGather) {
      inst.reduceType = scalarTypeOf(json.at("reduce_dtype").asString());
      inst.reduction = parseReduction(json.at("reduction").asString());
      inst.preDivide = json.at("pre_divide").asDouble();
      inst.postDivide = json.at("post_divide").asDouble();
      if (!(inst.preDivide > 0) || !(inst.postDivide > 0))
        throw std::runtime_error(inst.name + ": divide factors must be positive");
    }
    break;
  case Instruction::Kind::Wait:
    inst.name = "wait";
    inst.future = index(json.at("future"));
    inst.results = slotList(json.at("results"));
    if (const Value *gradsOf = json.find("grads_of"))
      for (const Value &param : gradsOf->asArray())
        inst.params.push_back(param.asString());
    break;
  case Instruction::Kind::Release:
  case Instruction::Kind::Reshard:
  case Instruction::Kind::Return:
    inst.name = json.at("op").asString();
    inst.inputs = slotList(json.at("values"));
    break;
  case Instruction::Kind::Pointwise:
    inst.name = "pointwise";
    inst.kernel = index(json.at("kernel"));
    inst.inputs = slotList(json.at("inputs"));
    inst.results = slotList(json.at("results"));
    break;
  case Instruction::Kind::AllSlice:
    inst.name = "all_slice";
    inst.group = json.at("group").asString();
    inst.inputs = {index(json.at("input"))};
    inst.rows = json.at("rows").asInt();
    inst.results = {index(json.at("result"))};
    break;
  }
  return inst;
}

std::vector<std::string> stringList(const Value &value) {
  std::vector<std::string> out;
  for (const Value &item : value.asArray())
    out.push_back(item.asString());
  return out;
}

GroupSpec loadGroup(const Value &json) {
  GroupSpec group;
  group.key = json.at("key").asString();
  group.grid = json.at("grid").asString();
  group.gridShape = intList(json.at("grid_shape"));
  group.axes = intList(json.at("axes"));
  group.size = json.at("size").asInt();
  for (const Value &members : json.at("members").asArray())
    group.members.push_back(intList(members));
  return group;
}

ParamSpec loadParam(const Value &json) {
  ParamSpec param;
  param.name = json.at("name").asString();
  param.shape = intList(json.at("shape"));
  param.dtype = json.at("dtype").asString();
  param.unit = json.at("unit").asString();
  param.trainable = json.at("trainable").asBool();
  param.offloaded = json.at("offloaded").asBool();
  param.ignored = json.at("ignored").asBool();
  if (param.ignored && (param.offloaded || !json.at("group").isNull()))
    throw std::runtime_error("an ignored parameter is neither sharded nor offloaded");
  param.tied = stringList(json.at("tied"));
  if (const Value &group = json.at("group"); !group.isNull()) {
    param.group = group.asString();
    param.shardRows = json.at("shard_rows").asInt();
    param.padding = json.at("padding").asInt();
  }
  return param;
}

BufferSpec loadBuffer(const Value &json) {
  return {json.at("name").asString(), intList(json.at("shape")), json.at("dtype").asString()};
}

KernelOperand loadKernelOperand(const Value &json) {
  return {intList(json.at("shape")), intList(json.at("strides")), intList(json.at("steps"))};
}

KernelSpec loadKernel(const Value &json) {
  KernelSpec kernel;
  kernel.name = json.at("name").asString();
  kernel.source = json.at("source").asString();
  kernel.dtype = scalarTypeOf(json.at("element_type").asString());
  kernel.extents = intList(json.at("extents"));
  for (const Value &operand : json.at("inputs").asArray())
    kernel.inputs.push_back(loadKernelOperand(operand));
  for (const Value &operand : json.at("outputs").asArray())
    kernel.outputs.push_back(loadKernelOperand(operand));
  kernel.vector = json.at("vector").asInt();
  kernel.block = json.at("block").asInt();
  kernel.grid = json.at("grid").asInt();
  return kernel;
}

/// Runs `load` on each entry of the manifest list `key`, naming the entry
/// that fails.
template <typename T, typename Load>
std::vector<T> loadList(const Value &root, const char *key, Load load) {
  std::vector<T> out;
  const json::Array &items = root.at(key).asArray();
  for (size_t i = 0; i < items.size(); ++i) {
    try {
      out.push_back(load(items[i]));
    } catch (const std::exception &error) {
      throw std::runtime_error(std::string(key) + " entry " + std::to_string(i) + ": " + error.what());
    }
  }
  return out;
}

} // namespace

Program Program::load(const std::string &text, std::optional<c10::Device> runOn, const std::string &kernelCache) {
  Value root;
  std::string deviceKind;
  try {
    root = Value::parse(text);
    if (root.at("format").asString() != kProgramFormat)
      throw std::runtime_error("not an fsdpc program");
    if (root.at("version").asInt() != kProgramVersion)
      throw std::runtime_error("program format version " + std::to_string(root.at("version").asInt()) +
                               ", this runtime reads version " + std::to_string(kProgramVersion) +
                               " (recompile the step)");
    deviceKind = root.at("device").asString();
    if (!isDeviceKind(deviceKind))
      throw std::runtime_error("device '" + deviceKind + "' is not " + std::string(kDeviceKindList));
    if (runOn && deviceKind != c10::DeviceTypeName(runOn->type(), /*lower_case=*/true))
      throw std::runtime_error("the step was compiled for " + deviceKind + " and cannot run on " + runOn->str() +
                               " (capture it for this device)");
  } catch (const std::exception &error) {
    throw std::runtime_error(std::string("fsdp_rt: cannot load the program: ") + error.what());
  }
  Program program(runOn ? withIndex(*runOn) : c10::Device(deviceKind));
  program.deviceKind_ = deviceKind;
  try {
    program.groups_ = loadList<GroupSpec>(root, "groups", loadGroup);
    program.params_ = loadList<ParamSpec>(root, "params", loadParam);
    program.buffers_ = loadList<BufferSpec>(root, "buffers", loadBuffer);
    program.kernels_ = loadList<KernelSpec>(root, "kernels", loadKernel);
    root.at("functions").asArray();
  } catch (const std::exception &error) {
    throw std::runtime_error(std::string("fsdp_rt: cannot load the manifest: ") + error.what());
  }
  for (const Value &json : root.at("functions").asArray()) {
    Function function;
    try {
      function.name = json.at("name").asString();
      function.step = json.at("step").asBool();
      function.cudaGraph = json.at("cuda_graph").asBool();
      function.inputs = slotList(json.at("inputs"));
      for (const Value &spec : json.at("input_types").asArray())
        function.inputTypes.push_back({intList(spec.at("shape")), scalarTypeOf(spec.at("dtype").asString())});
      function.slots = count(json.at("slots"), "slots");
      function.futures = count(json.at("futures"), "futures");
    } catch (const std::exception &error) {
      throw std::runtime_error("fsdp_rt: cannot load @" + function.name + ": " + error.what());
    }
    const json::Array &instructions = json.at("instructions").asArray();
    for (size_t i = 0; i < instructions.size(); ++i) {
      try {
        function.instructions.push_back(loadInstruction(instructions[i], program.device()));
      } catch (const std::exception &error) {
        std::string where;
        if (instructions[i].kind() == Value::Kind::Object)
          if (const Value *loc = instructions[i].find("loc"))
            if (loc->kind() == Value::Kind::String)
              where = " (" + loc->asString() + ")";
        std::string name;
        if (instructions[i].kind() == Value::Kind::Object)
          if (const Value *n = instructions[i].find("name"))
            if (n->kind() == Value::Kind::String)
              name = " " + n->asString();
        throw std::runtime_error("fsdp_rt: cannot load @" + function.name + " instruction " +
                                 std::to_string(i) + name + where + ": " + error.what());
      }
    }
    program.functions_.push_back(std::move(function));
  }
  validateProgram(program);
  if (runOn && std::any_of(program.functions_.begin(), program.functions_.end(),
                           [](const Function &function) { return function.cudaGraph; }))
    program.replays_ = std::make_shared<ReplayedSteps>();
  if (runOn && runOn->is_cuda() && !program.kernels_.empty()) {
    try {
      program.loadedKernels_ = std::make_shared<const LoadedKernels>(program.kernels_, program.device(), kernelCache);
    } catch (const std::exception &error) {
      throw std::runtime_error(std::string("fsdp_rt: cannot load the program's kernels: ") + error.what());
    }
  }
  return program;
}

const Function &Program::function(const std::string &name) const {
  for (const Function &function : functions_)
    if (function.name == name)
      return function;
  throw std::runtime_error("fsdp_rt: the program has no function '" + name + "'");
}

} // namespace fsdp_rt
