//===- GroupUnits.cpp - merge consecutive wrap units ----------------------===//
//
// Before (a captured step, size=2):
//
//   fsdp.unit @root root class "Net"
//   fsdp.unit @"blocks.0" class "Block"
//   fsdp.unit @"blocks.1" class "Block"
//   fsdp.unit @"blocks.2" class "Block"
//   fsdp.param @"blocks.1.w" : tensor<4x4xf32> unit @"blocks.1"
//
// After: one unit per two, the last one alone; parameters name their group.
//
//   fsdp.unit @root root class "Net"
//   fsdp.unit @"blocks.0+blocks.1" class "Block" members ["blocks.0", "blocks.1"]
//   fsdp.unit @"blocks.2" class "Block"
//   fsdp.param @"blocks.1.w" : tensor<4x4xf32> unit @"blocks.0+blocks.1"
//
// Test: test/Transforms/group-units.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_GROUPUNITSPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Why the units of `module` cannot be regrouped, or success.
LogicalResult checkGroupable(ModuleOp module) {
  for (UnitOp unit : module.getOps<UnitOp>()) {
    if (unit.getMembersAttr())
      return unit.emitError() << "fsdp-group-units: unit " << FlatSymbolRefAttr::get(unit.getSymNameAttr())
                              << " is already a group; group the captured units once";
    if (unit.getOffloaded())
      return unit.emitError() << "fsdp-group-units: unit " << FlatSymbolRefAttr::get(unit.getSymNameAttr())
                              << " is already offloaded; group units before fsdp-offload-units";
  }
  WalkResult sharded = module.walk([](Operation *op) {
    auto param = dyn_cast<ParamOp>(op);
    bool collective = !param && !isa<UnitOp>(op) && op->hasAttr("unit");
    if (collective || (param && param.isSharded())) {
      op->emitError("fsdp-group-units runs on a captured step, before fsdp-shard-parameters");
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(sharded.wasInterrupted());
}

/// Replaces each run of `size` consecutive non-root units with one unit
/// listing them as members; returns each old unit name's group.
llvm::StringMap<StringAttr> groupUnits(ModuleOp module, int64_t size) {
  SmallVector<UnitOp> units;
  for (UnitOp unit : module.getOps<UnitOp>())
    if (!unit.getRoot())
      units.push_back(unit);
  llvm::StringMap<StringAttr> groupOf;
  OpBuilder builder(module.getContext());
  for (size_t first = 0; first < units.size(); first += size) {
    SmallVector<UnitOp> members(units.begin() + first,
                                units.begin() + std::min<size_t>(first + size, units.size()));
    if (members.size() == 1)
      continue;
    std::string name;
    SmallVector<StringRef> paths;
    StringAttr moduleClass = members.front().getModuleClassAttr();
    for (UnitOp member : members) {
      name += (name.empty() ? "" : "+") + member.getSymName().str();
      paths.push_back(member.getSymName());
      if (member.getModuleClassAttr() != moduleClass)
        moduleClass = {}; // a group of several classes names none
    }
    builder.setInsertionPoint(members.front());
    auto group = UnitOp::create(builder, members.front().getLoc(), builder.getStringAttr(name),
                                /*root=*/nullptr, moduleClass, builder.getStrArrayAttr(paths),
                                /*offloaded=*/nullptr);
    for (UnitOp member : members) {
      groupOf[member.getSymName()] = group.getSymNameAttr();
      member.erase();
    }
  }
  return groupOf;
}

struct GroupUnitsPass : public fsdp::impl::GroupUnitsPassBase<GroupUnitsPass> {
  using GroupUnitsPassBase::GroupUnitsPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (size < 1) {
      module.emitError() << "fsdp-group-units: size must be at least 1, got " << static_cast<int64_t>(size);
      return signalPassFailure();
    }
    if (size == 1)
      return;
    if (failed(checkGroupable(module)))
      return signalPassFailure();
    llvm::StringMap<StringAttr> groupOf = groupUnits(module, size);
    for (ParamOp param : module.getOps<ParamOp>()) {
      auto group = groupOf.find(param.getUnitAttr().getValue());
      if (group != groupOf.end())
        param.setUnitAttr(FlatSymbolRefAttr::get(group->second));
    }
  }
};

} // namespace
