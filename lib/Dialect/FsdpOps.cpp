//===- FsdpOps.cpp - fsdp dialect verifiers and folders -------------------===//
//
// Every invariant in an op's ODS description is enforced here. Rules that need
// other symbols (grids, units, parameters) live in verifySymbolUses, which MLIR
// runs after all ops have passed their own verifiers.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Dialect/Pointwise.h"
#include "fsdp/Support/AtenOpName.h"
#include "fsdp_rt/ProgramFormat.h"
#include "fsdp_rt/ShardLayout.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::fsdp;

#define GET_OP_CLASSES
#include "fsdp/FsdpOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

namespace {

/// "1 input", "2 inputs".
std::string counted(size_t count, StringRef noun) {
  return (Twine(count) + " " + noun + (count == 1 ? "" : "s")).str();
}

/// Resolves grids, units and parameters for one op and reports what does not
/// resolve on that op.
class SymbolResolver {
public:
  SymbolResolver(Operation *user, SymbolTableCollection &tables)
      : user(user), tables(tables) {}

  /// Number of ranks in the group spanned by `axes` of the grid `gridRef`.
  FailureOr<int64_t> groupSize(FlatSymbolRefAttr gridRef,
                               ArrayRef<int16_t> axes) const {
    auto grid = tables.lookupNearestSymbolFrom<shard::GridOp>(user, gridRef);
    if (!grid)
      return user->emitOpError() << gridRef << " does not name a shard.grid";
    if (axes.empty())
      return user->emitOpError("needs at least one grid axis");
    ArrayRef<int64_t> shape = grid.getShape();
    llvm::SmallSet<int16_t, 4> seen;
    SmallVector<int64_t> sizes;
    for (int16_t axis : axes) {
      if (axis < 0 || axis >= static_cast<int64_t>(shape.size()))
        return user->emitOpError()
               << "grid axis " << axis << " is out of range for " << gridRef
               << " of rank " << shape.size();
      if (!seen.insert(axis).second)
        return user->emitOpError() << "grid axis " << axis << " is listed twice";
      if (ShapedType::isDynamic(shape[axis]))
        return user->emitOpError()
               << "grid axis " << axis << " of " << gridRef
               << " has a dynamic size; collectives need a static group size";
      sizes.push_back(shape[axis]);
    }
    std::optional<int64_t> size = fsdp_rt::groupSizeOf(sizes.data(), sizes.size());
    if (!size)
      return user->emitOpError() << "group size over grid axes of " << gridRef
                                 << " is not a positive 64-bit integer";
    return *size;
  }

  FailureOr<ParamOp> param(FlatSymbolRefAttr name) const {
    auto param = tables.lookupNearestSymbolFrom<ParamOp>(user, name);
    if (!param)
      return user->emitOpError() << name << " does not name an fsdp.param";
    return param;
  }

  FailureOr<UnitOp> unit(FlatSymbolRefAttr name) const {
    auto unit = tables.lookupNearestSymbolFrom<UnitOp>(user, name);
    if (!unit)
      return user->emitOpError() << name << " does not name an fsdp.unit";
    return unit;
  }

  /// The offloaded unit that owns `param`, if its unit is offloaded.
  /// The offloaded unit that keeps `param` in host memory, or null.
  UnitOp offloadedUnitOf(ParamOp param) const {
    auto unit = tables.lookupNearestSymbolFrom<UnitOp>(param, param.getUnitAttr());
    return unit && unit.getOffloaded() && !param.getIgnored() ? unit : UnitOp();
  }

  /// The type this rank stores for `param`: its padded shard when sharded,
  /// its logical type otherwise.
  FailureOr<RankedTensorType> localType(ParamOp param) const {
    RankedTensorType logical = param.getLogicalType();
    if (!param.isSharded())
      return logical;
    // The parameter's own verifier reports a half-given sharding; just refuse.
    if (!param.getGridAxes() || !param.getPaddingAttr() || logical.getRank() < 1)
      return failure();
    FailureOr<int64_t> size = groupSize(param.getGridAttr(), *param.getGridAxes());
    if (failed(size))
      return failure();
    auto layout = fsdp_rt::Dim0ShardLayout::create(logical.getDimSize(0), *size);
    if (!layout)
      return user->emitOpError() << "cannot shard " << logical.getDimSize(0)
                                 << " rows over " << *size << " ranks";
    SmallVector<int64_t> shape(logical.getShape());
    shape[0] = layout->shardRows();
    return RankedTensorType::get(shape, logical.getElementType());
  }

private:
  Operation *user;
  SymbolTableCollection &tables;
};

/// Checks that `shardRows` is the shard size of `fullRows` over `groupSize`
/// ranks; `what` names the tensor pair in the message.
LogicalResult verifyShardRows(Operation *op, const Twine &what, int64_t fullRows,
                              int64_t shardRows, int64_t groupSize) {
  auto layout = fsdp_rt::Dim0ShardLayout::create(fullRows, groupSize);
  if (!layout)
    return op->emitOpError() << what << ": cannot shard " << fullRows
                             << " rows over " << groupSize << " ranks";
  if (layout->shardRows() != shardRows)
    return op->emitOpError()
           << what << ": a shard of " << fullRows << " rows over " << groupSize
           << " ranks has " << layout->shardRows() << " rows (ceil(" << fullRows
           << "/" << groupSize << ")), not " << shardRows;
  return success();
}

/// Checks the parts of a full/shard tensor pair that do not depend on the
/// group size: ranks >= 1 and equal, equal trailing dims.
LogicalResult verifyFullShardPair(Operation *op, const Twine &what,
                                  RankedTensorType full, RankedTensorType shard) {
  if (full.getRank() < 1 || shard.getRank() < 1)
    return op->emitOpError() << what << ": dim-0 sharding needs rank >= 1";
  if (full.getRank() != shard.getRank())
    return op->emitOpError() << what << ": ranks differ (" << full << " vs "
                             << shard << ")";
  for (int64_t dim = 1; dim < full.getRank(); ++dim)
    if (full.getDimSize(dim) != shard.getDimSize(dim))
      return op->emitOpError() << what << ": dim " << dim << " differs ("
                               << full << " vs " << shard << ")";
  return success();
}

/// The common rules of a bucketed collective: a non-empty bucket whose future
/// carries one result per input, waited for exactly once in the same block.
LogicalResult verifyBucketAndPairing(Operation *op, ValueRange inputs,
                                     FutureType future) {
  if (inputs.empty())
    return op->emitOpError("needs at least one tensor in its bucket");
  if (future.getResults().size() != inputs.size())
    return op->emitOpError() << "future carries "
                             << counted(future.getResults().size(), "result") << " for "
                             << counted(inputs.size(), "input");
  Value result = op->getResult(0);
  if (result.use_empty())
    return op->emitOpError("is never waited for: its future needs an fsdp.wait");
  if (!result.hasOneUse())
    return op->emitOpError("future is used more than once; it takes exactly one fsdp.wait");
  Operation *user = *result.getUsers().begin();
  if (!isa<WaitOp>(user))
    return op->emitOpError("future must be consumed by fsdp.wait, not ")
           << user->getName();
  if (user->getBlock() != op->getBlock())
    return op->emitOpError("must be waited for in the block that starts it");
  return success();
}

/// Dtype and reduction rules shared by reduce-scatter and all-reduce.
LogicalResult verifyReduction(Operation *op, TypeRange inputs, ArrayRef<Type> results,
                              shard::ReductionKind kind, Type reduceDtype,
                              std::optional<APFloat> preDivide,
                              std::optional<APFloat> postDivide, bool scatter) {
  for (auto [index, type] : llvm::enumerate(inputs))
    if (!isa<FloatType>(cast<RankedTensorType>(type).getElementType()))
      return op->emitOpError() << "input " << index << " has element type "
                               << cast<RankedTensorType>(type).getElementType()
                               << "; reductions need floating point";
  for (auto [index, type] : llvm::enumerate(results))
    if (!isa<FloatType>(cast<RankedTensorType>(type).getElementType()))
      return op->emitOpError() << "result " << index << " has element type "
                               << cast<RankedTensorType>(type).getElementType()
                               << "; reductions need floating point";
  if (!isa<FloatType>(reduceDtype))
    return op->emitOpError() << "reduce_dtype must be a floating-point type, got "
                             << reduceDtype;

  using shard::ReductionKind;
  bool allowed = kind == ReductionKind::Sum || kind == ReductionKind::Average;
  if (!scatter)
    allowed |= kind == ReductionKind::Max || kind == ReductionKind::Min ||
               kind == ReductionKind::Product;
  if (!allowed)
    return op->emitOpError() << "reduction " << shard::stringifyReductionKind(kind)
                             << " is not supported here; use "
                             << (scatter ? "sum or average"
                                         : "sum, average, max, min or product");
  if (kind == ReductionKind::Average && reduceDtype.isF16())
    return op->emitOpError("average in f16 can overflow; use reduction sum with "
                           "pre_divide and post_divide");
  for (auto [name, factor] : {std::pair{"pre_divide", preDivide},
                              std::pair{"post_divide", postDivide}}) {
    if (!factor)
      continue;
    if (kind != ReductionKind::Sum)
      return op->emitOpError() << name << " applies only to reduction sum";
    if (!factor->isFiniteNonZero() || factor->isNegative())
      return op->emitOpError() << name << " must be positive and finite";
  }
  return success();
}

bool isCollectiveStart(Operation *op) {
  return isa_and_nonnull<AllGatherStartOp, ReduceScatterStartOp, AllReduceStartOp>(op);
}

/// Rejects a second op of type OpT directly in the function body around `op`
/// (any of its blocks); the first one in block order passes.
template <typename OpT>
LogicalResult verifyFirstInFunction(Operation *op, StringRef what) {
  for (Block &block : *op->getParentRegion()) {
    for (OpT other : block.getOps<OpT>()) {
      if (other.getOperation() == op)
        return success();
      InFlightDiagnostic diag = op->emitOpError()
                                << "appears twice in one function; a step has one "
                                << what;
      diag.attachNote(other.getLoc()) << "the first one";
      return diag;
    }
  }
  return success();
}

LogicalResult verifyInFunctionBody(Operation *op) {
  if (!isa_and_nonnull<FunctionOpInterface>(op->getParentOp()))
    return op->emitOpError("must sit directly in a function body");
  return success();
}

} // namespace

//===----------------------------------------------------------------------===//
// UnitOp
//===----------------------------------------------------------------------===//

SmallVector<StringRef> UnitOp::getModulePaths() {
  SmallVector<StringRef> paths;
  if (ArrayAttr members = getMembersAttr())
    for (Attribute member : members)
      paths.push_back(cast<StringAttr>(member).getValue());
  else
    paths.push_back(getSymName());
  return paths;
}

LogicalResult UnitOp::verify() {
  if (ArrayAttr members = getMembersAttr()) {
    if (getRoot())
      return emitOpError("is the root and cannot list members: the root wraps what no other unit does");
    if (members.empty())
      return emitOpError("lists no members");
    llvm::StringSet<> seen;
    for (Attribute member : members) {
      StringRef path = cast<StringAttr>(member).getValue();
      if (path.empty())
        return emitOpError("lists an empty member: the root is not a member");
      if (!seen.insert(path).second)
        return emitOpError() << "lists member '" << path << "' twice";
    }
  }
  // Each module is wrapped once: checked against the units declared before.
  SmallVector<StringRef> mine = getModulePaths();
  for (UnitOp other : (*this)->getBlock()->getOps<UnitOp>()) {
    if (other == *this)
      break;
    if (getRoot() && other.getRoot())
      return emitOpError() << "declares a second root unit; @"
                           << other.getSymName() << " is already the root";
    if (getRoot() || other.getRoot())
      continue;
    for (StringRef path : other.getModulePaths())
      if (llvm::is_contained(mine, path))
        return emitOpError() << "wraps module '" << path << "', which unit "
                             << FlatSymbolRefAttr::get(other.getSymNameAttr())
                             << " already wraps";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// ParamOp
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  if (ArrayAttr aliases = getAliasesAttr()) {
    llvm::SmallPtrSet<Attribute, 4> seen;
    for (Attribute alias : aliases) {
      StringRef name = cast<StringAttr>(alias).getValue();
      if (name.empty())
        return emitOpError("tied names must not be empty");
      if (name == getSymName())
        return emitOpError() << "lists its own name '" << name << "' as tied";
      if (!seen.insert(alias).second)
        return emitOpError() << "lists tied name '" << name << "' twice";
    }
  }
  unsigned given = (getGridAttr() != nullptr) + getGridAxes().has_value() +
                   getPadding().has_value();
  if (given != 0 && given != 3)
    return emitOpError("'sharded on', 'axes' and 'padding' must be given together");
  if (!isSharded())
    return success();
  if (getIgnored())
    return emitOpError("is ignored (left whole on every rank), so it cannot be sharded");
  if (getLogicalType().getRank() < 1)
    return emitOpError("a sharded parameter needs rank >= 1 (it is split along dim 0)");
  if (getPaddingAttr().getInt() < 0)
    return emitOpError("padding must be non-negative, got ") << getPaddingAttr().getInt();
  return success();
}

bool ParamOp::isOffloaded() {
  if (getIgnored())
    return false;
  auto unit = SymbolTable::lookupNearestSymbolFrom<UnitOp>(*this, getUnitAttr());
  return unit && unit.getOffloaded();
}

LogicalResult ParamOp::verifySymbolUses(SymbolTableCollection &tables) {
  SymbolResolver resolve(*this, tables);
  FailureOr<UnitOp> unit = resolve.unit(getUnitAttr());
  if (failed(unit))
    return failure();
  if (unit->getOffloaded() && !isSharded() && !getIgnored())
    return emitOpError() << "belongs to offloaded unit " << getUnitAttr()
                         << " but is not sharded: only shards are offloaded (no-shard keeps whole "
                            "parameters on the device)";
  if (ArrayAttr aliases = getAliasesAttr()) {
    for (Attribute alias : aliases) {
      auto ref = FlatSymbolRefAttr::get(cast<StringAttr>(alias));
      if (tables.lookupNearestSymbolFrom<ParamOp>(*this, ref))
        return emitOpError() << "is tied to " << ref
                             << ", which is declared as a parameter of its own";
    }
  }
  if (!isSharded())
    return success();
  FailureOr<int64_t> size = resolve.groupSize(getGridAttr(), *getGridAxes());
  if (failed(size))
    return failure();
  int64_t rows = getLogicalType().getDimSize(0);
  auto layout = fsdp_rt::Dim0ShardLayout::create(rows, *size);
  if (!layout)
    return emitOpError() << "cannot shard " << rows << " rows over " << *size
                         << " ranks";
  if (layout->paddingRows() != getPaddingAttr().getInt())
    return emitOpError() << "padding is " << getPaddingAttr().getInt() << ", but " << rows
                         << " rows over " << *size << " ranks pad "
                         << layout->paddingRows() << " (" << *size << " x "
                         << layout->shardRows() << " - " << rows << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// GetParamOp
//===----------------------------------------------------------------------===//

LogicalResult GetParamOp::verifySymbolUses(SymbolTableCollection &tables) {
  SymbolResolver resolve(*this, tables);
  FailureOr<ParamOp> param = resolve.param(getNameAttr());
  if (failed(param))
    return failure();
  FailureOr<RankedTensorType> expected = resolve.localType(*param);
  if (failed(expected))
    return failure();
  if (getResult().getType() != *expected)
    return emitOpError() << "result type " << getResult().getType()
                         << " is not the local type of " << getNameAttr() << ", "
                         << *expected
                         << (param->isSharded() ? " (its padded shard)" : "");
  if (UnitOp unit = resolve.offloadedUnitOf(*param))
    for (Operation *user : getResult().getUsers()) {
      auto gather = dyn_cast<AllGatherStartOp>(user);
      if (isa<ReleaseOp>(user) || (gather && gather.getHost()))
        continue;
      return emitOpError() << "reads " << getNameAttr() << " of offloaded unit @"
                           << unit.getSymName()
                           << ", a shard in host memory, which only a `host` all-gather may read; "
                           << user->getName() << " at " << user->getLoc() << " reads it";
    }
  return success();
}

//===----------------------------------------------------------------------===//
// GetAccumulatedGradOp
//===----------------------------------------------------------------------===//

LogicalResult GetAccumulatedGradOp::verifySymbolUses(SymbolTableCollection &tables) {
  FailureOr<ParamOp> param = SymbolResolver(*this, tables).param(getNameAttr());
  if (failed(param))
    return failure();
  if (!param->isTrainable())
    return emitOpError() << getNameAttr() << " is frozen and accumulates no gradient";
  if (getResult().getType() != param->getLogicalType())
    return emitOpError() << "result type " << getResult().getType()
                         << " is not the logical type of " << getNameAttr() << ", "
                         << param->getLogicalType();
  return success();
}

//===----------------------------------------------------------------------===//
// GetBufferOp
//===----------------------------------------------------------------------===//

LogicalResult GetBufferOp::verifySymbolUses(SymbolTableCollection &tables) {
  auto buffer = tables.lookupNearestSymbolFrom<BufferOp>(*this, getNameAttr());
  if (!buffer)
    return emitOpError() << getNameAttr() << " does not name an fsdp.buffer";
  if (getResult().getType() != buffer.getType())
    return emitOpError() << "result type " << getResult().getType() << " is not the type of "
                         << getNameAttr() << ", " << buffer.getType();
  return success();
}

//===----------------------------------------------------------------------===//
// AtenOp
//===----------------------------------------------------------------------===//

/// Walks one `args` entry, counting operand references.
static LogicalResult verifyAtenArg(AtenOp op, Attribute arg,
                                   SmallVectorImpl<unsigned> &referenceCounts) {
  if (auto list = dyn_cast<ArrayAttr>(arg)) {
    for (Attribute element : list)
      if (failed(verifyAtenArg(op, element, referenceCounts)))
        return failure();
    return success();
  }
  if (auto integer = dyn_cast<IntegerAttr>(arg); integer && integer.getType().isIndex()) {
    int64_t index = integer.getInt();
    if (index < 0 || index >= static_cast<int64_t>(referenceCounts.size()))
      return op.emitOpError() << "args refers to operand " << index << ", but the op has "
                              << counted(referenceCounts.size(), "operand");
    ++referenceCounts[index];
    return success();
  }
  if (isa<IntegerAttr, FloatAttr, StringAttr, UnitAttr, TypeAttr>(arg))
    return success();
  return op.emitOpError() << "args entry " << arg
                          << " is not an operand index, list or literal "
                             "(integer, float, string, type, unit)";
}

LogicalResult AtenOp::verify() {
  std::optional<AtenOpName> name = AtenOpName::parse(getCallee());
  if (!name)
    return emitOpError() << "'" << getCallee()
                         << "' is not an operator name of the form ns::name[.overload]";
  if (name->isInPlace())
    return emitOpError() << "'" << getCallee()
                         << "' is an in-place operator; capture must be functional";
  if (std::optional<int64_t> region = getCheckpoint(); region && *region < 0)
    return emitOpError() << "checkpoint region " << *region << " is negative; regions are numbered from 0";
  ArrayAttr args = getArgsAttr();
  if (!args)
    return success();
  SmallVector<unsigned> referenceCounts(getInputs().size(), 0);
  for (Attribute arg : args)
    if (failed(verifyAtenArg(*this, arg, referenceCounts)))
      return failure();
  for (auto [index, count] : llvm::enumerate(referenceCounts))
    if (count != 1)
      return emitOpError() << "operand " << index << " is referenced "
                           << (count == 0 ? "nowhere" : counted(count, "time"))
                           << " in args; each operand is referenced exactly once";
  return success();
}

void AtenOp::getEffects(
    SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>> &effects) {
  if (!getRandom())
    return;
  effects.emplace_back(MemoryEffects::Read::get(), RandomGeneratorResource::get());
  effects.emplace_back(MemoryEffects::Write::get(), RandomGeneratorResource::get());
}

//===----------------------------------------------------------------------===//
// PointwiseOp
//===----------------------------------------------------------------------===//

/// Whether `shape` broadcasts to exactly `target`.
static bool broadcastsTo(ArrayRef<int64_t> shape, ArrayRef<int64_t> target) {
  return broadcastShape(shape, target) == SmallVector<int64_t>(target);
}

YieldOp PointwiseOp::getYield() { return cast<YieldOp>(getBody().front().getTerminator()); }

LogicalResult PointwiseOp::verify() {
  if (getInputs().empty() || getInputs().size() > fsdp_rt::kMostKernelTensors || getResults().empty() ||
      getResults().size() > fsdp_rt::kMostKernelTensors)
    return emitOpError() << "has " << counted(getInputs().size(), "input") << " and "
                         << counted(getResults().size(), "result") << "; a kernel takes 1 to 8 of each";
  auto type = cast<RankedTensorType>(getResults().front().getType());
  for (Type result : getResults().getTypes())
    if (cast<RankedTensorType>(result).getShape() != type.getShape())
      return emitOpError() << "results must share one shape, got " << type << " and " << result;
  // One element type for every tensor: a kernel loads and stores one
  // storage type. A condition is a comparison inside.
  Type element = type.getElementType();
  for (Type t : llvm::concat<const Type>(getInputs().getTypes(), getResults().getTypes()))
    if (cast<RankedTensorType>(t).getElementType() != element || !isKernelElementType(element))
      return emitOpError() << "inputs and results must share one element type, f32, bf16 or f16; got " << t
                           << " with results of " << type;
  SmallVector<int64_t> broadcast;
  for (Type input : getInputs().getTypes()) {
    ArrayRef<int64_t> shape = cast<RankedTensorType>(input).getShape();
    if (!broadcastsTo(shape, type.getShape()))
      return emitOpError() << "input " << input << " does not broadcast to the results' shape " << type;
    broadcast = *broadcastShape(broadcast, shape); // both broadcast to the results' shape
  }
  if (ArrayRef<int64_t>(broadcast) != type.getShape())
    return emitOpError() << "the inputs broadcast to " << RankedTensorType::get(broadcast, type.getElementType())
                         << ", not to the results' shape " << type;
  return success();
}

// The body's rules run once its ops have passed their own verifiers, so an
// fsdp.aten's `args` are known to be in range when the table reads them.
LogicalResult PointwiseOp::verifyRegions() {
  auto type = cast<RankedTensorType>(getResults().front().getType());
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size() ||
      TypeRange(body.getArgumentTypes()) != getInputs().getTypes())
    return emitOpError("body arguments must have the inputs' types");
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("body must end with fsdp.yield");
  if (yield.getValues().getTypes() != getResults().getTypes())
    return emitOpError("fsdp.yield must name one value of each result's type");
  for (Operation &op : body.without_terminator()) {
    auto aten = dyn_cast<AtenOp>(op);
    if (!aten)
      return op.emitOpError("cannot be computed by a pointwise kernel: only fsdp.aten calls can");
    if (std::string why = pointwiseRefusal(aten); !why.empty())
      return aten.emitOpError("cannot be computed element by element: ") << why;
    auto result = cast<RankedTensorType>(aten->getResult(0).getType());
    if (!broadcastsTo(result.getShape(), type.getShape()))
      return aten.emitOpError() << "result " << result << " does not broadcast to the kernel's shape " << type;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// CastOp
//===----------------------------------------------------------------------===//

LogicalResult CastOp::verify() {
  auto input = getInput().getType();
  auto result = getResult().getType();
  if (input.getShape() != result.getShape())
    return emitOpError() << "changes the shape from " << input << " to " << result
                         << "; a cast keeps the shape";
  for (Type element : {input.getElementType(), result.getElementType()})
    if (!isa<IntegerType, FloatType>(element))
      return emitOpError() << "casts integer and floating-point tensors, not "
                           << element;
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getResult().getType())
    return getInput();
  return {};
}

//===----------------------------------------------------------------------===//
// DataParallelSumOp
//===----------------------------------------------------------------------===//

LogicalResult DataParallelSumOp::verify() {
  Type element = getInput().getType().getElementType();
  if (!isa<FloatType>(element))
    return emitOpError() << "sums floating-point tensors, not " << element;
  return success();
}

//===----------------------------------------------------------------------===//
// LossOp and GradientsOp
//===----------------------------------------------------------------------===//

LogicalResult LossOp::verify() {
  if (failed(verifyInFunctionBody(*this)))
    return failure();
  return verifyFirstInFunction<LossOp>(*this, "loss");
}

LogicalResult GradientsOp::verify() {
  if (getParams().size() != getGrads().size())
    return emitOpError() << "lists " << counted(getParams().size(), "parameter")
                         << " but " << counted(getGrads().size(), "gradient");
  if (getGrads().empty())
    return emitOpError("lists no gradients; a step without any omits the op");
  llvm::SmallPtrSet<Attribute, 16> seen;
  for (Attribute param : getParams()) {
    auto ref = dyn_cast<FlatSymbolRefAttr>(param);
    if (!ref)
      return emitOpError() << param << " is not a parameter name (@fqn)";
    if (!seen.insert(ref).second)
      return emitOpError() << ref << " is listed twice; a parameter has one gradient";
  }
  if (failed(verifyInFunctionBody(*this)) ||
      failed(verifyFirstInFunction<GradientsOp>(*this, "gradients op")))
    return failure();
  for (Operation &other : *(*this)->getBlock()) {
    if (&other == getOperation())
      return emitOpError("must follow the function's fsdp.loss (gradients belong to "
                         "the backward pass)");
    if (isa<LossOp>(other))
      return success();
  }
  return success();
}

LogicalResult GradientsOp::verifySymbolUses(SymbolTableCollection &tables) {
  SymbolResolver resolve(*this, tables);
  for (auto [attr, grad] : llvm::zip(getParams(), getGrads())) {
    auto name = cast<FlatSymbolRefAttr>(attr);
    FailureOr<ParamOp> param = resolve.param(name);
    if (failed(param))
      return failure();
    if (!param->isTrainable())
      return emitOpError() << name << " is frozen and has no gradient";
    FailureOr<RankedTensorType> expected =
        getUnreduced() ? param->getLogicalType() : resolve.localType(*param);
    if (failed(expected))
      return failure();
    if (grad.getType() != *expected)
      return emitOpError() << "gradient of " << name << " has type " << grad.getType()
                           << ", expected " << *expected
                           << (param->isSharded() && !getUnreduced() ? " (its padded shard)"
                                                                     : " (its logical type)");
    if (getUnreduced())
      continue;
    if (UnitOp unit = resolve.offloadedUnitOf(*param)) {
      auto wait = grad.getDefiningOp<WaitOp>();
      Operation *start = wait ? wait.getFuture().getDefiningOp() : nullptr;
      if (!start || !start->hasAttr("host"))
        return emitOpError() << "gradient of " << name << " (offloaded unit @" << unit.getSymName()
                             << ") must come from a `host` reduction, which delivers it to host memory";
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Collective starts
//===----------------------------------------------------------------------===//

namespace {

/// Calls `check(index, input, result)` for each bucket entry until one fails.
LogicalResult forEachBucketEntry(
    ValueRange inputs, FutureType future,
    function_ref<LogicalResult(unsigned, RankedTensorType, RankedTensorType)> check) {
  for (auto [index, pair] : llvm::enumerate(llvm::zip(inputs, future.getResults())))
    if (failed(check(index, cast<RankedTensorType>(std::get<0>(pair).getType()),
                     cast<RankedTensorType>(std::get<1>(pair)))))
      return failure();
  return success();
}

/// Resolves a collective's unit, if it names one, and its group size; a
/// `host` collective needs an offloaded unit.
template <typename CollectiveOp>
FailureOr<int64_t> resolveCollective(CollectiveOp op, SymbolTableCollection &tables) {
  SymbolResolver resolve(op, tables);
  UnitOp unit;
  if (op.getUnitAttr()) {
    FailureOr<UnitOp> found = resolve.unit(op.getUnitAttr());
    if (failed(found))
      return failure();
    unit = *found;
  }
  if (op.getHost() && !(unit && unit.getOffloaded()))
    return op.emitOpError() << "is `host`, but "
                            << (unit ? "its unit @" + unit.getSymName().str() + " is not offloaded"
                                     : std::string("names no unit"))
                            << "; only an offloaded unit's shards and gradients are in host memory";
  return resolve.groupSize(op.getGridAttr(), op.getGridAxes());
}

/// A `host` reduction's results are gradients in host memory: only
/// fsdp.gradients (or a release) may read them. Once they are there the
/// host optimizer may step the unit (in backward), so no later `host`
/// all-gather of the same unit may read its shards.
template <typename ReducingOp>
LogicalResult verifyHostResults(ReducingOp op) {
  if (!op.getHost())
    return success();
  for (Operation *wait : op.getFuture().getUsers())
    for (Value result : wait->getResults())
      for (Operation *user : result.getUsers())
        if (!isa<GradientsOp, ReleaseOp>(user))
          return op.emitOpError() << "delivers its results to host memory, but "
                                  << user->getName() << " at " << user->getLoc()
                                  << " reads one on the device; only fsdp.gradients may";
  for (Operation *later = op->getNextNode(); later; later = later->getNextNode())
    if (auto gather = dyn_cast<AllGatherStartOp>(later);
        gather && gather.getHost() && gather.getUnitAttr() == op.getUnitAttr())
      return op.emitOpError() << "delivers unit " << op.getUnitAttr()
                              << "'s gradients to host memory, where its optimizer may step the shards at "
                                 "once, but the all-gather at "
                              << gather.getLoc() << " reads those shards later";
  return success();
}

/// Checks each bucket entry's dim-0 rows once the group size is known.
/// `inputsAreShards`: all-gather (inputs are shards) vs reduce-scatter.
template <typename CollectiveOp>
LogicalResult verifyBucketRows(CollectiveOp op, SymbolTableCollection &tables,
                               bool inputsAreShards) {
  FailureOr<int64_t> size = resolveCollective(op, tables);
  if (failed(size))
    return failure();
  return forEachBucketEntry(
      op.getInputs(), op.getFuture().getType(),
      [&](unsigned index, RankedTensorType input, RankedTensorType result) {
        RankedTensorType full = inputsAreShards ? result : input;
        RankedTensorType shard = inputsAreShards ? input : result;
        return verifyShardRows(op, (inputsAreShards ? "input " : "result ") + Twine(index),
                               full.getDimSize(0), shard.getDimSize(0), *size);
      });
}

} // namespace

LogicalResult AllGatherStartOp::verify() {
  FutureType future = getFuture().getType();
  if (failed(verifyBucketAndPairing(*this, getInputs(), future)))
    return failure();
  Type commDtype = cast<RankedTensorType>(future.getResults().front()).getElementType();
  auto checkEntry = [&](unsigned index, RankedTensorType input,
                        RankedTensorType full) -> LogicalResult {
    if (failed(verifyFullShardPair(*this, "input " + Twine(index), full, input)))
      return failure();
    if (full.getElementType() != commDtype)
      return emitOpError() << "result " << index << " has element type "
                           << full.getElementType() << ", but the bucket gathers in "
                           << commDtype << "; a bucket has one communication dtype";
    Type from = input.getElementType();
    if (from != commDtype && !(isa<FloatType>(from) && isa<FloatType>(commDtype)))
      return emitOpError() << "input " << index << " (" << from
                           << ") cannot be cast to " << commDtype
                           << " in copy-in; only float-to-float casts are fused";
    return success();
  };
  if (failed(forEachBucketEntry(getInputs(), future, checkEntry)))
    return failure();
  if (IntegerAttr depth = getPrefetchAttr()) {
    if (depth.getInt() < 1)
      return emitOpError("prefetch depth must be >= 1, got ") << depth.getInt();
    if (!getUnitAttr())
      return emitOpError("prefetch needs the unit it prefetches for");
  }
  if (getHost() && getIntoResults())
    return emitOpError("is `host` and `into_results`: a host bucket is copied in on the host-to-device stream "
                       "and gathered through a receive buffer");
  return success();
}

LogicalResult AllGatherStartOp::verifySymbolUses(SymbolTableCollection &tables) {
  if (failed(verifyBucketRows(*this, tables, /*inputsAreShards=*/true)))
    return failure();
  if (getHost())
    for (auto [index, input] : llvm::enumerate(getInputs()))
      if (!input.getDefiningOp<GetParamOp>())
        return emitOpError() << "is `host`, but input " << index
                             << " is not a parameter shard (fsdp.get_param); only shards are in host memory";
  return success();
}

LogicalResult ReduceScatterStartOp::verify() {
  FutureType future = getFuture().getType();
  if (failed(verifyBucketAndPairing(*this, getInputs(), future)) ||
      failed(forEachBucketEntry(
          getInputs(), future,
          [&](unsigned index, RankedTensorType full, RankedTensorType shard) {
            return verifyFullShardPair(*this, "input " + Twine(index), full, shard);
          })))
    return failure();
  return verifyReduction(*this, getInputs().getTypes(), future.getResults(),
                         getReduction(), getReduceDtype(), getPreDivide(),
                         getPostDivide(), /*scatter=*/true);
}

LogicalResult ReduceScatterStartOp::verifySymbolUses(SymbolTableCollection &tables) {
  if (failed(verifyBucketRows(*this, tables, /*inputsAreShards=*/false)))
    return failure();
  return verifyHostResults(*this);
}

LogicalResult AllReduceStartOp::verify() {
  FutureType future = getFuture().getType();
  if (failed(verifyBucketAndPairing(*this, getInputs(), future)) ||
      failed(forEachBucketEntry(
          getInputs(), future,
          [&](unsigned index, RankedTensorType input,
              RankedTensorType result) -> LogicalResult {
            if (input.getShape() == result.getShape())
              return success();
            return emitOpError() << "result " << index << " has shape " << result
                                 << ", but an all-reduce keeps the input's shape "
                                 << input;
          })))
    return failure();
  return verifyReduction(*this, getInputs().getTypes(), future.getResults(),
                         getReduction(), getReduceDtype(), getPreDivide(),
                         getPostDivide(), /*scatter=*/false);
}

LogicalResult AllReduceStartOp::verifySymbolUses(SymbolTableCollection &tables) {
  if (failed(resolveCollective(*this, tables)))
    return failure();
  return verifyHostResults(*this);
}

//===----------------------------------------------------------------------===//
// WaitOp
//===----------------------------------------------------------------------===//

LogicalResult WaitOp::inferReturnTypes(MLIRContext *, std::optional<Location>,
                                       ValueRange operands, DictionaryAttr,
                                       OpaqueProperties, RegionRange,
                                       SmallVectorImpl<Type> &inferred) {
  if (operands.size() != 1)
    return failure();
  auto future = dyn_cast<FutureType>(operands.front().getType());
  if (!future)
    return failure();
  llvm::append_range(inferred, future.getResults());
  return success();
}

LogicalResult WaitOp::verify() {
  if (!isCollectiveStart(getFuture().getDefiningOp()))
    return emitOpError("future must come straight from an fsdp.*_start op");
  return success();
}

//===----------------------------------------------------------------------===//
// ReshardOp
//===----------------------------------------------------------------------===//

/// The wait of a collective start, if it has one.
static Operation *waitOf(Operation *start) {
  Value future = start->getResult(0);
  return future.hasOneUse() ? *future.getUsers().begin() : nullptr;
}

static Attribute literalAt(AtenOp op, unsigned position) {
  ArrayAttr args = op.getArgsAttr();
  return args && position < args.size() ? args[position] : Attribute();
}

static std::optional<int64_t> asInteger(Attribute attr) {
  auto integer = dyn_cast_or_null<IntegerAttr>(attr);
  if (!integer || isa<IndexType>(integer.getType()))
    return std::nullopt;
  return integer.getInt();
}

std::optional<int64_t> mlir::fsdp::integerLiteral(AtenOp op, unsigned position) {
  return asInteger(literalAt(op, position));
}

std::optional<double> mlir::fsdp::numberLiteral(AtenOp op, unsigned position) {
  Attribute literal = literalAt(op, position);
  if (auto real = dyn_cast_or_null<FloatAttr>(literal))
    return real.getValueAsDouble();
  if (std::optional<int64_t> integer = asInteger(literal))
    return static_cast<double>(*integer);
  return std::nullopt;
}

std::optional<SmallVector<int64_t>> mlir::fsdp::integerListLiteral(AtenOp op, unsigned position) {
  auto list = dyn_cast_or_null<ArrayAttr>(literalAt(op, position));
  if (!list)
    return std::nullopt;
  SmallVector<int64_t> values;
  for (Attribute item : list) {
    std::optional<int64_t> value = asInteger(item);
    if (!value)
      return std::nullopt;
    values.push_back(*value);
  }
  return values;
}

ArrayAttr mlir::fsdp::integerListAttr(Builder &builder, ArrayRef<int64_t> values) {
  return builder.getArrayAttr(
      llvm::map_to_vector(values, [&](int64_t value) -> Attribute { return builder.getI64IntegerAttr(value); }));
}

bool mlir::fsdp::isReshape(AtenOp op) {
  return op && (op.getCallee() == "aten::view" || op.getCallee() == "aten::_unsafe_view");
}

Operation *mlir::fsdp::cloneRecomputed(OpBuilder &builder, Operation &op, IRMapping &mapping) {
  Operation *clone = builder.clone(op, mapping);
  clone->setAttr(kRecomputedAttr, builder.getUnitAttr());
  if (auto aten = dyn_cast<AtenOp>(clone))
    aten.removeCheckpointAttr();
  return clone;
}

Value mlir::fsdp::createView(OpBuilder &builder, Location loc, Value value, ArrayRef<int64_t> shape,
                             StringAttr module, IntegerAttr checkpoint) {
  auto type = RankedTensorType::get(shape, cast<RankedTensorType>(value.getType()).getElementType());
  return AtenOp::create(builder, loc, TypeRange{type}, builder.getStringAttr("aten::view"), ValueRange{value},
                        builder.getArrayAttr({builder.getIndexAttr(0), integerListAttr(builder, shape)}), UnitAttr(),
                        module, checkpoint)
      ->getResult(0);
}

std::optional<bool> mlir::fsdp::boolLiteral(AtenOp op, unsigned position) {
  if (auto flag = dyn_cast_or_null<BoolAttr>(literalAt(op, position)))
    return flag.getValue();
  return std::nullopt;
}

bool mlir::fsdp::isViewOf(Operation *op) {
  auto aten = dyn_cast_or_null<AtenOp>(op);
  return aten && !aten.getInputs().empty() && isViewOperator(aten.getCallee());
}

SmallVector<Value> mlir::fsdp::viewClosure(Value value) {
  SmallVector<Value> closure{value};
  for (size_t i = 0; i < closure.size(); ++i)
    for (OpOperand &use : closure[i].getUses())
      if (use.getOperandNumber() == 0 && isViewOf(use.getOwner()))
        llvm::append_range(closure, use.getOwner()->getResults());
  return closure;
}

bool mlir::fsdp::isGatheredBuffer(Value value) {
  auto wait = value.getDefiningOp<WaitOp>();
  return wait && isa_and_nonnull<AllGatherStartOp>(wait.getFuture().getDefiningOp());
}

namespace {
/// Where a use stands against an op that ends a value's lifetime, in that
/// op's block; a use inside a nested region counts at its enclosing op.
enum class UseOrder { Before, NotBefore, OutsideTheBlock };

UseOrder useOrder(Operation *end, Operation *user) {
  Operation *ancestor = end->getBlock()->findAncestorOpInBlock(*user);
  if (!ancestor)
    return UseOrder::OutsideTheBlock;
  return ancestor->isBeforeInBlock(end) ? UseOrder::Before : UseOrder::NotBefore;
}
} // namespace

LogicalResult ReshardOp::verify() {
  if (getBuffers().empty())
    return emitOpError("frees nothing; it needs at least one gathered buffer");
  llvm::SmallPtrSet<Value, 8> listed;
  for (auto [index, buffer] : llvm::enumerate(getBuffers())) {
    if (!listed.insert(buffer).second)
      return emitOpError() << "lists buffer " << index << " twice";
    if (!isGatheredBuffer(buffer))
      return emitOpError() << "operand " << index
                           << " is not a gathered buffer (a result of fsdp.wait "
                              "on fsdp.all_gather_start)";
    for (Value alias : viewClosure(buffer)) {
      bool isView = alias != buffer;
      for (Operation *user : alias.getUsers()) {
        if (user == getOperation())
          continue;
        UseOrder order = useOrder(getOperation(), user);
        if (order == UseOrder::OutsideTheBlock) {
          InFlightDiagnostic diag = emitOpError()
                                    << "frees buffer " << index
                                    << ", which is used outside the block that frees it";
          diag.attachNote(user->getLoc()) << "used here";
          return diag;
        }
        if (order == UseOrder::NotBefore) {
          InFlightDiagnostic diag =
              isa<ReshardOp>(user) && !isView
                  ? emitOpError() << "buffer " << index << " is freed again later"
                  : emitOpError() << "frees buffer " << index << " before its last use"
                                  << (isView ? " (through a view that shares its storage)" : "");
          diag.attachNote(user->getLoc()) << "used after the free here";
          return diag;
        }
        if (!isCollectiveStart(user))
          continue;
        Operation *inFlightUntil = waitOf(user);
        if (inFlightUntil && useOrder(getOperation(), inFlightUntil) == UseOrder::NotBefore) {
          InFlightDiagnostic diag = emitOpError()
                                    << "frees buffer " << index
                                    << " while a collective reading it is in flight";
          diag.attachNote(inFlightUntil->getLoc()) << "the collective is waited for here";
          return diag;
        }
      }
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// ReleaseOp
//===----------------------------------------------------------------------===//

LogicalResult ReleaseOp::verify() {
  if (getValues().empty())
    return emitOpError("releases nothing; it needs at least one value");
  llvm::SmallPtrSet<Value, 8> listed;
  for (auto [index, value] : llvm::enumerate(getValues())) {
    if (!listed.insert(value).second)
      return emitOpError() << "lists value " << index << " twice";
    if (isGatheredBuffer(value))
      return emitOpError() << "value " << index
                           << " is a gathered buffer; fsdp.reshard frees gathered buffers";
    for (Operation *user : value.getUsers()) {
      if (user == getOperation())
        continue;
      UseOrder order = useOrder(getOperation(), user);
      if (order == UseOrder::OutsideTheBlock) {
        InFlightDiagnostic diag = emitOpError()
                                  << "releases value " << index
                                  << ", which is used outside the block that releases it";
        diag.attachNote(user->getLoc()) << "used here";
        return diag;
      }
      if (order == UseOrder::NotBefore) {
        InFlightDiagnostic diag = isa<ReleaseOp>(user)
                                      ? emitOpError() << "value " << index << " is released again later"
                                      : emitOpError() << "releases value " << index
                                                      << " before its last use";
        diag.attachNote(user->getLoc()) << "used after the release here";
        return diag;
      }
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// AllSliceOp
//===----------------------------------------------------------------------===//

LogicalResult AllSliceOp::verify() {
  auto full = getInput().getType();
  auto shard = getResult().getType();
  if (failed(verifyFullShardPair(*this, "result", full, shard)))
    return failure();
  if (full.getElementType() != shard.getElementType())
    return emitOpError() << "changes the element type from " << full.getElementType()
                         << " to " << shard.getElementType() << "; a slice keeps it";
  return success();
}

LogicalResult AllSliceOp::verifySymbolUses(SymbolTableCollection &tables) {
  FailureOr<int64_t> size =
      SymbolResolver(*this, tables).groupSize(getGridAttr(), getGridAxes());
  if (failed(size))
    return failure();
  return verifyShardRows(*this, "result", getInput().getType().getDimSize(0),
                         getResult().getType().getDimSize(0), *size);
}
