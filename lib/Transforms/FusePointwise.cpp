//===- FusePointwise.cpp - chains of elementwise calls as one kernel ------===//
//
// Before: RMSNorm's tail and SwiGLU's product, as capture records them, are
// one kernel launch and one full-size tensor per call:
//
//   %e = fsdp.aten "aten::add.Tensor"(%ms) args [0 : index, 1.0e-05, 1] : (tensor<8x1xbf16>) -> tensor<8x1xbf16>
//   %r = fsdp.aten "aten::rsqrt"(%e) : (tensor<8x1xbf16>) -> tensor<8x1xbf16>
//   %n = fsdp.aten "aten::mul.Tensor"(%x, %r) : (tensor<8x64xbf16>, tensor<8x1xbf16>) -> tensor<8x64xbf16>
//   %y = fsdp.aten "aten::mul.Tensor"(%n, %w) : (tensor<8x64xbf16>, tensor<64xbf16>) -> tensor<8x64xbf16>
//
// After (when only %y is read later): one fsdp.pointwise, one kernel, one
// tensor written:
//
//   %y = fsdp.pointwise (%ms, %x, %w) module "norm" : (...) -> tensor<8x64xbf16> {
//   ^bb0(%a: tensor<8x1xbf16>, %b: tensor<8x64xbf16>, %c: tensor<64xbf16>):
//     %e = fsdp.aten "aten::add.Tensor"(%a) args [0 : index, 1.0e-05, 1] : ...
//     ... fsdp.yield %y2 : tensor<8x64xbf16>
//   }
//
// Calls join a group in program order. A call that reads values of groups
// joins them (merged) when their calls can all move down to its place
// (nothing outside reads their results or frees their operands in
// between), or joins one of them by moving down to it, or by moving up to
// it (its other operands exist there, at most 8 calls earlier). The group
// stays within a kernel's 8 inputs and 8 outputs, every value it hands out
// has the group's full shape and is not a view (an expand is read inside
// only), and the kernel's outputs have the strides eager's calls would
// have given them (fsdp/Analysis/Strides.h; a later view relies on it):
// inputs may be strided (a permuted or sliced view), as long as the
// kernel's TensorIterator orders the dimensions as eager's last call did.
// A group of one call stays a call. Only CUDA steps (`fsdp.device` = "cuda") fuse: the kernels are CUDA
// source; a CPU step keeps ATen's.
//
// Test: test/Transforms/fuse-pointwise.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Analysis/Strides.h"
#include "fsdp/Dialect/Pointwise.h"
#include "fsdp/Transforms/Passes.h"
#include "fsdp_rt/ProgramFormat.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_FUSEPOINTWISEPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// A chain of calls to become one kernel: its calls in program order, and
/// the call before which the kernel will run.
struct Group {
  SmallVector<AtenOp> members;
  llvm::SmallPtrSet<Operation *, 8> memberSet;
  Operation *anchor = nullptr;
};

ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }

/// Groups one function body's elementwise calls and rewrites each group of
/// two or more into an fsdp.pointwise.
class PointwiseFuser {
public:
  explicit PointwiseFuser(Block &body) : body(body) {
    for (auto [i, op] : llvm::enumerate(body)) {
      index[&op] = i;
      for (Value result : op.getResults())
        (void)strides.of(result); // in program order: no deep recursion later
    }
  }

  void run() {
    for (Operation &op : body) {
      auto aten = dyn_cast<AtenOp>(op);
      if (!aten || !pointwiseRefusal(aten).empty())
        continue;
      if (!joinProducerGroups(aten) && fits({aten})) {
        groups.push_back(std::make_unique<Group>());
        add(*groups.back(), aten);
        groups.back()->anchor = aten;
      }
    }
    for (auto &group : groups)
      if (group->members.size() > 1 && !handsOutAView(*group))
        rewrite(*group);
  }

private:
  /// Where `op` runs once the groups are rewritten: at its group's anchor.
  int64_t position(Operation *op) {
    auto it = groupOf.find(op);
    return index[it != groupOf.end() ? it->second->anchor : op];
  }

  /// A group whose result read outside is a view (an expand nothing in the
  /// group consumed) stays calls: a kernel would copy what a view shares.
  bool handsOutAView(Group &group) {
    return llvm::any_of(boundary(group.members).second,
                        [](Value output) { return isViewOf(output.getDefiningOp()); });
  }

  void add(Group &group, AtenOp op) {
    group.members.push_back(op);
    group.memberSet.insert(op);
    groupOf[op] = &group;
  }

  /// Joins `op` to the groups that produce its operands: all of them merged
  /// and moved down to `op`; else the latest one that `op` fits, moved down
  /// to `op` or with `op` moved up to it.
  bool joinProducerGroups(AtenOp op) {
    SmallVector<Group *> candidates;
    for (Value input : op.getInputs())
      if (auto it = groupOf.find(input.getDefiningOp()); it != groupOf.end() && !llvm::is_contained(candidates, it->second))
        candidates.push_back(it->second);
    llvm::sort(candidates, [&](Group *a, Group *b) { return index[a->anchor] > index[b->anchor]; });
    if (candidates.size() > 1) {
      SmallVector<AtenOp> merged;
      for (Group *group : candidates)
        llvm::append_range(merged, group->members);
      llvm::sort(merged, [&](AtenOp a, AtenOp b) { return index[a] < index[b]; });
      merged.push_back(op);
      if (canSinkTo(merged, op) && fits(merged)) {
        Group &into = *candidates.front();
        for (Group *other : ArrayRef(candidates).drop_front())
          for (AtenOp member : other->members) {
            into.memberSet.insert(member);
            groupOf[member] = &into;
          }
        merged.pop_back();
        into.members = merged;
        for (Group *other : ArrayRef(candidates).drop_front())
          other->members.clear();
        add(into, op);
        into.anchor = op;
        return true;
      }
    }
    for (Group *group : candidates) {
      SmallVector<AtenOp> members = group->members;
      members.push_back(op);
      if (!fits(members))
        continue;
      if (canSinkTo(members, op)) {
        add(*group, op);
        group->anchor = op;
        return true;
      }
      if (canHoistTo(op, *group)) {
        add(*group, op);
        return true;
      }
    }
    return false;
  }

  /// Whether `members` may all move down to `op`'s place: nothing outside
  /// them reads their results, or frees their operands, before `op`.
  bool canSinkTo(ArrayRef<AtenOp> members, AtenOp op) {
    llvm::SmallPtrSet<Operation *, 16> inside;
    for (AtenOp member : members)
      inside.insert(member);
    int64_t to = index[op];
    for (AtenOp member : members) {
      int64_t from = index[member];
      for (Operation *user : member->getUsers()) {
        Operation *top = body.findAncestorOpInBlock(*user);
        if (!inside.contains(top) && position(top) < to)
          return false;
      }
      for (Value input : member.getInputs())
        for (Operation *user : input.getUsers()) {
          Operation *top = body.findAncestorOpInBlock(*user);
          if (isa<ReshardOp, ReleaseOp>(top) && index[top] > from && index[top] < to)
            return false;
        }
    }
    return true;
  }

  /// Whether `op` may move up to `group`'s place: its other operands are
  /// made before it (where their own groups run), and it is close enough
  /// that computing it early holds its result only a few calls longer.
  /// Later moves see `op` at the group's anchor (`position`), so no group
  /// it reads moves below it.
  bool canHoistTo(AtenOp op, Group &group) {
    constexpr int64_t kMostCallsEarlier = 8;
    int64_t to = index[group.anchor];
    if (index[op] - to > kMostCallsEarlier)
      return false;
    return llvm::all_of(op.getInputs(), [&](Value input) {
      Operation *def = input.getDefiningOp();
      return group.memberSet.contains(def) || !def || position(def) < to;
    });
  }

  /// The group's inputs (values from outside, in order of first use) and
  /// outputs (results read outside, in program order).
  static std::pair<SetVector<Value>, SmallVector<Value>> boundary(ArrayRef<AtenOp> members) {
    llvm::SmallPtrSet<Operation *, 8> inside;
    for (AtenOp member : members)
      inside.insert(member);
    SetVector<Value> inputs;
    SmallVector<Value> outputs;
    for (AtenOp member : members) {
      for (Value input : member.getInputs())
        if (!inside.contains(input.getDefiningOp()))
          inputs.insert(input);
      Value result = member->getResult(0);
      if (llvm::any_of(result.getUsers(), [&](Operation *user) { return !inside.contains(user); }))
        outputs.push_back(result);
    }
    return {inputs, outputs};
  }

  /// Whether `members` make one kernel: at most 8 inputs and 8 outputs,
  /// one element type, every output of the shape all values broadcast to
  /// and laid out as eager would lay it out (the kernel's TensorIterator
  /// orders the dimensions by its inputs, eager's calls by theirs).
  bool fits(ArrayRef<AtenOp> members) {
    auto [inputs, outputs] = boundary(members);
    if (inputs.empty() || inputs.size() > fsdp_rt::kMostKernelTensors || outputs.empty() ||
        outputs.size() > fsdp_rt::kMostKernelTensors)
      return false;
    Type element = cast<RankedTensorType>(members.front()->getResult(0).getType()).getElementType();
    SmallVector<int64_t> shape;
    for (AtenOp member : members) {
      auto result = cast<RankedTensorType>(member->getResult(0).getType());
      std::optional<SmallVector<int64_t>> joined = broadcastShape(shape, result.getShape());
      if (result.getElementType() != element || !joined)
        return false;
      shape = *joined;
    }
    for (Value output : outputs)
      if (shapeOf(output) != ArrayRef<int64_t>(shape))
        return false;
    SmallVector<Strides> inputStrides;
    for (Value input : inputs) {
      std::optional<Strides> known = strides.of(input);
      if (!known)
        return false;
      inputStrides.push_back(*known);
    }
    SmallVector<StridedOperand> operands;
    for (auto [input, known] : llvm::zip(inputs, inputStrides))
      operands.push_back({shapeOf(input), known});
    Strides fused = elementwiseResultStrides(shape, operands);
    // A broadcast handed out is a view, never a kernel's output: the group
    // is not rewritten unless a later call reads it inside (handsOutAView).
    return llvm::all_of(outputs, [&](Value output) {
      if (isViewOf(output.getDefiningOp()))
        return true;
      std::optional<Strides> eager = strides.of(output);
      return eager && sameLayout(shape, fused, *eager);
    });
  }

  void rewrite(Group &group) {
    auto [inputs, outputs] = boundary(group.members);
    OpBuilder builder(group.anchor);
    SmallVector<Location> locations;
    for (AtenOp member : group.members)
      locations.push_back(member.getLoc());
    SmallVector<Type> resultTypes;
    for (Value output : outputs)
      resultTypes.push_back(output.getType());
    auto fused = PointwiseOp::create(builder, FusedLoc::get(builder.getContext(), locations), resultTypes,
                                     inputs.getArrayRef(), group.members.front().getModuleAttr());
    Block *kernel = builder.createBlock(&fused.getBody());
    IRMapping map;
    for (Value input : inputs)
      map.map(input, kernel->addArgument(input.getType(), input.getLoc()));
    for (AtenOp member : group.members)
      builder.clone(*member, map);
    SmallVector<Value> yielded;
    for (Value output : outputs)
      yielded.push_back(map.lookup(output));
    YieldOp::create(builder, fused.getLoc(), yielded);
    for (auto [output, result] : llvm::zip(outputs, fused.getResults()))
      output.replaceUsesWithIf(result, [&](OpOperand &use) { return !group.memberSet.contains(use.getOwner()); });
    for (AtenOp member : llvm::reverse(group.members))
      member->erase();
  }

  Block &body;
  DenseMap<Operation *, int64_t> index;
  EagerStrides strides;
  std::vector<std::unique_ptr<Group>> groups;
  DenseMap<Operation *, Group *> groupOf;
};

struct FusePointwisePass : public fsdp::impl::FusePointwisePassBase<FusePointwisePass> {
  using FusePointwisePassBase::FusePointwisePassBase;

  void runOnOperation() override {
    auto device = getOperation()->getAttrOfType<StringAttr>("fsdp.device");
    if (!device || device.getValue() != "cuda")
      return;
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal())
        PointwiseFuser(func.getBody().front()).run();
  }
};

} // namespace
