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
// (`bucket-mib=N` instead closes each group once its parameters reach N MiB,
// counting none that `ignored-params` names: those are never gathered.)
//
//   fsdp.unit @root root class "Net"
//   fsdp.unit @"blocks.0+blocks.1" class "Block" members ["blocks.0", "blocks.1"]
//   fsdp.unit @"blocks.2" class "Block"
//   fsdp.param @"blocks.1.w" : tensor<4x4xf32> unit @"blocks.0+blocks.1"
//
// Test: test/Transforms/group-units.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Dialect/FsdpOps.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>

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

/// Consecutive non-root units, in declaration order, cut into runs: of
/// `size` units, or, with `bucketBytes`, each closed once its gathered
/// parameters (all but `ignored`, which are never gathered) hold at least
/// that many bytes.
SmallVector<SmallVector<UnitOp>> runsOfUnits(ModuleOp module, int64_t size, int64_t bucketBytes,
                                            ArrayRef<ParamOp> ignored) {
  llvm::StringMap<int64_t> bytesOf;
  for (ParamOp param : module.getOps<ParamOp>())
    if (!llvm::is_contained(ignored, param))
      bytesOf[param.getUnitAttr().getValue()] += tensorBytes(param.getType());
  SmallVector<SmallVector<UnitOp>> runs(1);
  int64_t runBytes = 0;
  for (UnitOp unit : module.getOps<UnitOp>()) {
    if (unit.getRoot())
      continue;
    runs.back().push_back(unit);
    runBytes += bytesOf.lookup(unit.getSymName());
    bool full = bucketBytes ? runBytes >= bucketBytes : int64_t(runs.back().size()) == size;
    if (full) {
      runs.emplace_back();
      runBytes = 0;
    }
  }
  return runs;
}

/// Replaces each run of units with one unit listing them as members;
/// returns each old unit name's group.
llvm::StringMap<StringAttr> groupUnits(ModuleOp module, int64_t size, int64_t bucketBytes,
                                        ArrayRef<ParamOp> ignored) {
  llvm::StringMap<StringAttr> groupOf;
  OpBuilder builder(module.getContext());
  for (SmallVector<UnitOp> &members : runsOfUnits(module, size, bucketBytes, ignored)) {
    if (members.size() < 2)
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
    if (!(bucketMib >= 0) || (bucketMib > 0 && size != 1)) {
      module.emitError() << "fsdp-group-units: bucket-mib must be a non-negative number of MiB, and "
                            "cannot be given with a size; got bucket-mib="
                         << llvm::formatv("{0}", static_cast<double>(bucketMib)).str()
                         << " size=" << static_cast<int64_t>(size);
      return signalPassFailure();
    }
    auto bucketBytes = static_cast<int64_t>(std::ceil(bucketMib * double(1 << 20)));
    if (size == 1 && bucketBytes == 0)
      return;
    if (failed(checkGroupable(module)))
      return signalPassFailure();
    FailureOr<SmallVector<ParamOp>> ignored = paramsNamed(module, ignoredParams, "fsdp-group-units: ignored-params");
    if (failed(ignored))
      return signalPassFailure();
    llvm::StringMap<StringAttr> groupOf = groupUnits(module, size, bucketBytes, *ignored);
    for (ParamOp param : module.getOps<ParamOp>()) {
      auto group = groupOf.find(param.getUnitAttr().getValue());
      if (group != groupOf.end())
        param.setUnitAttr(FlatSymbolRefAttr::get(group->second));
    }
  }
};

} // namespace
