//===- VerifySchedule.cpp - check and hash the collective sequence --------===//
//
// Before:
//
//   func.func @train_step(...) {
//     %f = fsdp.all_gather_start %s on @fsdp_grid axes = [0] unit @u ...
//     ...
//   }
//
// After (the IR is unchanged but for two attributes):
//
//   func.func @train_step(...) attributes {fsdp.collective_count = 6 : i64,
//                                          fsdp.collective_hash = "9f2c..."} {
//
// The hash covers, in program order, each collective's kind, grid shape, axes,
// reduction, dtypes and shapes: whatever a rank must agree on with the others.
// It leaves out names, locations and units, which do not change what travels.
//
// Test: test/Transforms/verify-schedule.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/Format.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_VERIFYSCHEDULEPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// FNV-1a, 64 bits: stable across platforms and runs, unlike llvm::hash_value.
class Fnv1a {
public:
  void add(StringRef bytes) {
    for (unsigned char byte : bytes) {
      state ^= byte;
      state *= 0x100000001b3ULL;
    }
  }
  std::string hex() const {
    std::string out;
    llvm::raw_string_ostream(out) << llvm::format_hex_no_prefix(state, 16);
    return out;
  }

private:
  uint64_t state = 0xcbf29ce484222325ULL;
};

/// What ranks must agree on about one collective, as text.
std::string canonical(Operation *start, SymbolTableCollection &tables) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << start->getName().getStringRef() << "(";
  auto gridRef = start->getAttrOfType<FlatSymbolRefAttr>("grid");
  if (auto grid = tables.lookupNearestSymbolFrom<shard::GridOp>(start, gridRef))
    llvm::interleave(grid.getShape(), os, "x");
  os << ")";
  for (StringRef name : {"grid_axes", "reduction", "reduce_dtype", "pre_divide", "post_divide"})
    if (Attribute attr = start->getAttr(name))
      os << " " << name << "=" << attr;
  os << " in:";
  for (Type type : start->getOperandTypes())
    os << " " << type;
  os << " out:";
  for (Type type : futureTypes(start))
    os << " " << type;
  return text;
}

LogicalResult verifyStep(Step &step, SymbolTableCollection &tables) {
  Fnv1a hash;
  int64_t count = 0;
  WalkResult walk = step.func.walk([&](Operation *op) {
    if (!isCollectiveStart(op))
      return WalkResult::advance();
    if (op->getBlock() != &step.body()) {
      op->emitOpError("is under control flow; every rank must issue the same collectives, "
                      "so collectives belong in the step's straight-line body");
      return WalkResult::interrupt();
    }
    hash.add(canonical(op, tables));
    hash.add("\n");
    ++count;
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  for (auto start : step.body().getOps<AllGatherStartOp>())
    for (Value buffer : waitOf(start).getResults())
      if (llvm::none_of(buffer.getUsers(), [](Operation *user) { return isa<ReshardOp>(user); }))
        return start.emitOpError("gathers a buffer that is never freed; run "
                                 "fsdp-reshard-after-forward (or free it with fsdp.reshard)");
  Builder builder(step.func.getContext());
  step.func->setAttr("fsdp.collective_hash", builder.getStringAttr(hash.hex()));
  step.func->setAttr("fsdp.collective_count", builder.getI64IntegerAttr(count));
  return success();
}

struct VerifySchedulePass : public fsdp::impl::VerifySchedulePassBase<VerifySchedulePass> {
  using VerifySchedulePassBase::VerifySchedulePassBase;

  void runOnOperation() override {
    SymbolTableCollection tables;
    for (Step &step : collectSteps(getOperation()))
      if (failed(verifyStep(step, tables)))
        return signalPassFailure();
    markAllAnalysesPreserved();
  }
};

} // namespace
