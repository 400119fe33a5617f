//===- Program.cpp - load a program: resolve operators, convert literals --===//

#include "fsdp_rt/Program.h"
#include "fsdp_rt/ElementTypes.h"
#include "fsdp_rt/ProgramFormat.h"

#include <ATen/ScalarOps.h>

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
  case ElementType::U8: return c10::ScalarType::Byte;
  case ElementType::Bool: return c10::ScalarType::Bool;
  case ElementType::Complex64: return c10::ScalarType::ComplexFloat;
  case ElementType::Complex128: return c10::ScalarType::ComplexDouble;
  case ElementType::F8E4M3FN: return c10::ScalarType::Float8_e4m3fn;
  case ElementType::F8E5M2: return c10::ScalarType::Float8_e5m2;
  }
  throw std::runtime_error("unhandled element type '" + name + "'");
}

namespace {

using json::Value;

std::vector<int> slotList(const Value &value) {
  std::vector<int> out;
  for (const Value &item : value.asArray())
    out.push_back(item.isNull() ? -1 : static_cast<int>(item.asInt()));
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
    if (type->kind() != c10::TypeKind::OptionalType && type->kind() != c10::TypeKind::NoneType)
      throw std::runtime_error("None for the non-optional " + type->str());
    return out; // a None constant
  }
  if (auto optional = type->cast<c10::OptionalType>())
    type = optional->getElementType();
  if (const Value *slot = literal.find("tensor")) {
    out.kind = AtenArgument::Kind::Tensor;
    out.slots = {static_cast<int>(slot->asInt())};
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
  static const std::map<std::string, Instruction::Kind> kinds = {
      {"param", Instruction::Kind::Param},
      {"buffer", Instruction::Kind::Buffer},
      {"accumulated_grad", Instruction::Kind::AccumulatedGrad},
      {"aten", Instruction::Kind::Aten},
      {"cast", Instruction::Kind::Cast},
      {"loss", Instruction::Kind::Loss},
      {"gradients", Instruction::Kind::Gradients},
      {"all_gather", Instruction::Kind::AllGather},
      {"reduce_scatter", Instruction::Kind::ReduceScatter},
      {"all_reduce", Instruction::Kind::AllReduce},
      {"wait", Instruction::Kind::Wait},
      {"release", Instruction::Kind::Release},
      {"reshard", Instruction::Kind::Reshard},
      {"all_slice", Instruction::Kind::AllSlice},
      {"return", Instruction::Kind::Return},
  };
  auto it = kinds.find(op);
  if (it == kinds.end())
    throw std::runtime_error("unknown instruction '" + op + "'");
  return it->second;
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
    inst.results = {static_cast<int>(json.at("result").asInt())};
    break;
  case Instruction::Kind::Aten:
    inst.name = json.at("name").asString();
    loadAten(inst, json, device);
    break;
  case Instruction::Kind::Cast:
    inst.name = "cast";
    inst.inputs = {static_cast<int>(json.at("input").asInt())};
    inst.dtypes = {scalarTypeOf(json.at("dtype").asString())};
    inst.results = {static_cast<int>(json.at("result").asInt())};
    break;
  case Instruction::Kind::Loss:
    inst.name = "loss";
    inst.inputs = {static_cast<int>(json.at("input").asInt())};
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
    inst.inputs = slotList(json.at("inputs"));
    inst.future = static_cast<int>(json.at("future").asInt());
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
    inst.future = static_cast<int>(json.at("future").asInt());
    inst.results = slotList(json.at("results"));
    break;
  case Instruction::Kind::Release:
  case Instruction::Kind::Reshard:
  case Instruction::Kind::Return:
    inst.name = json.at("op").asString();
    inst.inputs = slotList(json.at("values"));
    break;
  case Instruction::Kind::AllSlice:
    inst.name = "all_slice";
    inst.group = json.at("group").asString();
    inst.inputs = {static_cast<int>(json.at("input").asInt())};
    inst.rows = json.at("rows").asInt();
    inst.results = {static_cast<int>(json.at("result").asInt())};
    break;
  }
  return inst;
}

/// Checks that every slot and future an instruction names is in range, so
/// that a damaged program fails at load rather than while running.
void checkRanges(const Function &function, const Instruction &inst) {
  auto check = [](int index, const char *what, int lowest, int limit) {
    if (index < lowest || index >= limit)
      throw std::runtime_error(std::string(what) + " " + std::to_string(index) + " out of range (" +
                               std::to_string(limit) + ")");
  };
  for (int slot : inst.inputs)
    check(slot, "slot", 0, function.slots);
  for (int slot : inst.results) // -1: a `none` result, not kept
    check(slot, "slot", -1, function.slots);
  using Kind = Instruction::Kind;
  if (inst.kind == Kind::AllGather || inst.kind == Kind::ReduceScatter ||
      inst.kind == Kind::AllReduce || inst.kind == Kind::Wait)
    check(inst.future, "future", 0, function.futures);
}

} // namespace

Program Program::load(const std::string &text, c10::Device device) {
  Value root;
  try {
    root = Value::parse(text);
    if (root.at("format").asString() != "fsdpc.program")
      throw std::runtime_error("not an fsdpc program");
    if (root.at("version").asInt() != kProgramVersion)
      throw std::runtime_error("program format version " + std::to_string(root.at("version").asInt()) +
                               ", this runtime reads version " + std::to_string(kProgramVersion) +
                               " (recompile the step)");
  } catch (const std::exception &error) {
    throw std::runtime_error(std::string("fsdp_rt: cannot load the program: ") + error.what());
  }
  Program program(device);
  for (const Value &json : root.at("functions").asArray()) {
    Function function;
    function.name = json.at("name").asString();
    try {
      function.step = json.at("step").asBool();
      if (const Value *hash = json.find("collective_hash"))
        function.collectiveHash = hash->asString();
      function.inputs = slotList(json.at("inputs"));
      for (const Value &spec : json.at("input_types").asArray())
        function.inputTypes.push_back({intList(spec.at("shape")), scalarTypeOf(spec.at("dtype").asString())});
      function.slots = static_cast<int>(json.at("slots").asInt());
      function.futures = static_cast<int>(json.at("futures").asInt());
      if (function.slots < 0 || function.futures < 0 || function.inputs.size() != function.inputTypes.size())
        throw std::runtime_error("bad slot, future or input counts");
      for (int slot : function.inputs)
        if (slot < 0 || slot >= function.slots)
          throw std::runtime_error("input slot out of range");
    } catch (const std::exception &error) {
      throw std::runtime_error("fsdp_rt: cannot load @" + function.name + ": " + error.what());
    }
    const json::Array &instructions = json.at("instructions").asArray();
    for (size_t i = 0; i < instructions.size(); ++i) {
      try {
        function.instructions.push_back(loadInstruction(instructions[i], device));
        checkRanges(function, function.instructions.back());
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
  return program;
}

const Function &Program::function(const std::string &name) const {
  for (const Function &function : functions_)
    if (function.name == name)
      return function;
  throw std::runtime_error("fsdp_rt: the program has no function '" + name + "'");
}

} // namespace fsdp_rt
