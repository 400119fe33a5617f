//===- BucketCollectives.cpp - one collective per unit and phase ----------===//
//
// Before (two parameters of unit @u, gathered where each is first used):
//
//   %a = fsdp.get_param @a ...
//   %fa = fsdp.all_gather_start %a on @fsdp_grid axes = [0] unit @u ...
//   %wa = fsdp.wait %fa ...
//   ... compute ...
//   %b = fsdp.get_param @b ...
//   %fb = fsdp.all_gather_start %b on @fsdp_grid axes = [0] unit @u ...
//   %wb = fsdp.wait %fb ...
//
// After (one bucket, started and waited where the first one was):
//
//   %a = fsdp.get_param @a ...
//   %b = fsdp.get_param @b ...
//   %f = fsdp.all_gather_start %a, %b on @fsdp_grid axes = [0] unit @u ...
//   %wa, %wb = fsdp.wait %f ...
//   ... compute ...
//
// Reductions merge the other way: at the last one, once every gradient of the
// bucket exists.
//
// Test: test/Transforms/bucket-collectives.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_BUCKETCOLLECTIVESPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// What two collectives must share to travel in one bucket: kind, group,
/// unit, reduction, phase and the element type on the wire.
std::string bucketKey(Operation *start, bool backward) {
  std::string key;
  llvm::raw_string_ostream os(key);
  os << start->getName() << "|" << backward << "|";
  for (StringRef name : {"grid", "grid_axes", "unit", "reduction", "reduce_dtype",
                         "pre_divide", "post_divide"})
    if (Attribute attr = start->getAttr(name))
      os << name << "=" << attr << "|";
  os << cast<RankedTensorType>(futureTypes(start).front()).getElementType();
  return key;
}

class Bucketer {
public:
  explicit Bucketer(Step &step) : step(step), builder(step.func.getContext()) {}

  void run() {
    for (StringRef kind : {AllGatherStartOp::getOperationName(),
                           ReduceScatterStartOp::getOperationName(),
                           AllReduceStartOp::getOperationName()}) {
      SmallVector<Operation *> sequence;
      SmallVector<std::string> keys; // taken before merging changes the block
      for (Operation &op : step.body())
        if (op.getName().getStringRef() == kind && waitOf(&op)) {
          sequence.push_back(&op);
          keys.push_back(bucketKey(&op, step.isBackward(&op)));
        }
      // Maximal runs of adjacent collectives with one key.
      for (size_t begin = 0; begin < sequence.size();) {
        size_t end = begin + 1;
        while (end < sequence.size() && keys[end] == keys[begin] &&
               canJoin(ArrayRef(sequence).slice(begin, end - begin), sequence[end]))
          ++end;
        if (end - begin > 1)
          merge(ArrayRef(sequence).slice(begin, end - begin));
        begin = end;
      }
    }
  }

private:
  /// An all-gather joins a bucket that starts earlier only if its inputs can
  /// move there: reads of parameters (pure, no operands) move, others must
  /// already be defined. A reduction joins one that is waited later only if
  /// nothing reads the bucket's earlier results before that later wait.
  bool canJoin(ArrayRef<Operation *> run, Operation *later) {
    if (isa<AllGatherStartOp>(run.front()))
      return llvm::all_of(later->getOperands(), [&](Value input) {
        Operation *def = input.getDefiningOp();
        return !def || isa<GetParamOp>(def) || def->isBeforeInBlock(run.front());
      });
    Operation *laterWait = waitOf(later);
    return llvm::all_of(run, [&](Operation *member) {
      return llvm::all_of(waitOf(member)->getUsers(), [&](Operation *user) {
        Operation *here = inBlock(step.body(), user);
        return here && laterWait->isBeforeInBlock(here);
      });
    });
  }

  void merge(ArrayRef<Operation *> run) {
    bool gather = isa<AllGatherStartOp>(run.front());
    Operation *anchorStart = gather ? run.front() : run.back();
    Operation *anchorWait = gather ? waitOf(run.front()) : waitOf(run.back());
    SmallVector<Value> inputs;
    SmallVector<Type> types;
    SmallVector<Location> locs;
    SmallVector<Operation *> moving; // decided before any moves: a move renumbers the block
    for (Operation *start : run) {
      for (Value input : start->getOperands()) {
        Operation *def = input.getDefiningOp();
        if (gather && def && anchorStart->isBeforeInBlock(def))
          moving.push_back(def);
        inputs.push_back(input);
      }
      llvm::append_range(types, futureTypes(start));
      locs.push_back(start->getLoc());
    }
    for (Operation *def : moving)
      def->moveBefore(anchorStart);
    builder.setInsertionPoint(anchorStart);
    Location loc = builder.getFusedLoc(locs);
    OperationState state(loc, anchorStart->getName());
    state.addOperands(inputs);
    state.addTypes(FutureType::get(builder.getContext(), types));
    state.addAttributes(anchorStart->getAttrs());
    Operation *bucket = builder.create(state);
    builder.setInsertionPoint(anchorWait);
    auto wait = WaitOp::create(builder, loc, bucket->getResult(0));
    unsigned next = 0;
    for (Operation *start : run) {
      WaitOp old = waitOf(start);
      for (Value result : old.getResults())
        result.replaceAllUsesWith(wait.getResult(next++));
      old.erase();
      start->erase();
    }
  }

  Step &step;
  OpBuilder builder;
};

struct BucketCollectivesPass
    : public fsdp::impl::BucketCollectivesPassBase<BucketCollectivesPass> {
  using BucketCollectivesPassBase::BucketCollectivesPassBase;

  void runOnOperation() override {
    for (Step &step : collectSteps(getOperation()))
      Bucketer(step).run();
  }
};

} // namespace
