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
// it (its other operands exist there, at most 16 ops earlier). A call that
// joins no producer joins a group that reads one of its operands too (a
// sibling: SwiGLU's two input gradients share the product's gradient), by
// moving up to it, so that one kernel reads the shared
// tensor once. A kernel that reads another kernel's result computed only
// from tensors it reads too computes it inside instead (SwiGLU's gradient
// kernel recomputes silu(gate) from gate). The group
// stays within a kernel's 8 inputs and 8 outputs, every value it hands out
// has the group's full shape and is not a view (an expand is read inside
// only), and the kernel's outputs have the strides eager's calls would
// have given them (fsdp/Analysis/Strides.h; a later view relies on it):
// inputs may be strided (a permuted or sliced view), as long as the
// kernel's TensorIterator orders the dimensions as eager's last call did.
// No move may raise the step's peak (keepsPeak): a kernel holds its calls'
// operands until it runs, so a product sunk to its consumer across a weight
// gradient keeps both its operands alive there.
// A group of one call stays a call.
//
// Half slices and concatenations of halves (rotary embeddings'
// `cat(-x[..., h:], x[..., :h])`) join as well: such a kernel runs over the
// split dimension as [2, h], reading whole inputs as split views and halves
// as slices of them, and a concatenation becomes a choice by which half an
// element is in (`aten::where.self` on a [2, 1] half index, 0 or 1 in the
// kernel's own element type: a kernel loads one storage type):
//
//   %k = fsdp.pointwise(%q2, %cos2, %q2hi, %q2lo, %sin2, %half) {
//     %qc = mul(%q2, %cos2)  %n = neg(%q2hi)  %second = ne(%half, 0)
//     %r = where(%second, %q2lo, %n)  ... add(%qc, mul(%r, %sin2)) }
//   %out = fsdp.aten "aten::view"(%k) args [0 : index, [2, 2, 4, 8]]
//
// Only CUDA steps (`fsdp.device` = "cuda") fuse: the kernels are CUDA
// source; a CPU step keeps ATen's.
//
// Test: test/Transforms/fuse-pointwise.mlir; python/tests/test_pointwise_halves.py
// evaluates kernels over halves against the calls they replace.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Memory.h"
#include "fsdp/Analysis/Step.h"
#include "fsdp/Analysis/Strides.h"
#include "fsdp/Dialect/Pointwise.h"
#include "fsdp/Transforms/Passes.h"
#include "fsdp_rt/ProgramFormat.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

#include <functional>
#include <map>

namespace mlir::fsdp {
#define GEN_PASS_DEF_FUSEPOINTWISEPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// A dimension split into two halves that a group's half slices and
/// concatenations address: the dimension counted from the last, and the
/// length of a half.
struct HalfSplit {
  int64_t fromEnd = 0;
  int64_t half = 0;
  bool operator==(const HalfSplit &other) const { return fromEnd == other.fromEnd && half == other.half; }
};

/// Which half a half slice (`x[..., :h]` or `x[..., h:]` of a dimension of
/// 2h, h >= 2) reads, with the split; nullopt for any other call.
std::optional<std::pair<HalfSplit, int>> halfSliceOf(AtenOp op) {
  if (op.getCallee() != "aten::slice.Tensor" || op.getInputs().size() != 1 || op->getNumResults() != 1)
    return std::nullopt;
  ArrayRef<int64_t> shape = cast<RankedTensorType>(op.getInputs()[0].getType()).getShape();
  std::optional<int64_t> dim = integerLiteral(op, 1), start = integerLiteral(op, 2), end = integerLiteral(op, 3),
                         step = integerLiteral(op, 4);
  auto rank = static_cast<int64_t>(shape.size());
  if (!dim || !start || !end || !step || *step != 1 || *dim < -rank || *dim >= rank)
    return std::nullopt;
  int64_t d = *dim < 0 ? *dim + rank : *dim;
  int64_t size = shape[d], half = size / 2;
  if (size % 2 || half < 2 || (*start != 0 && *start != half) || std::min(*end, size) - *start != half)
    return std::nullopt;
  return std::make_pair(HalfSplit{rank - 1 - d, half}, static_cast<int>(*start / half));
}

/// The split a concatenation of two halves (`cat([a, b], d)`, a and b of
/// one shape, h >= 2 long in d) makes; nullopt for any other call.
std::optional<HalfSplit> halfConcatenationOf(AtenOp op) {
  if (op.getCallee() != "aten::cat" || op.getInputs().size() != 2 || op->getNumResults() != 1 ||
      op.getInputs()[0].getType() != op.getInputs()[1].getType())
    return std::nullopt;
  ArrayRef<int64_t> shape = cast<RankedTensorType>(op.getInputs()[0].getType()).getShape();
  std::optional<int64_t> dim = integerLiteral(op, 1);
  auto rank = static_cast<int64_t>(shape.size());
  if (!dim || *dim < -rank || *dim >= rank)
    return std::nullopt;
  int64_t d = *dim < 0 ? *dim + rank : *dim;
  if (shape[d] < 2)
    return std::nullopt;
  return HalfSplit{rank - 1 - d, shape[d]};
}

std::optional<HalfSplit> halfSplitOf(AtenOp op) {
  if (auto slice = halfSliceOf(op))
    return slice->first;
  return halfConcatenationOf(op);
}

/// How long a value is in the split dimension.
enum class Extent { Whole, Half, One, Outside, Other };

Extent extentOf(Value value, HalfSplit split) {
  ArrayRef<int64_t> shape = cast<RankedTensorType>(value.getType()).getShape();
  if (static_cast<int64_t>(shape.size()) <= split.fromEnd)
    return Extent::Outside; // broadcast across it
  int64_t size = shape[shape.size() - 1 - split.fromEnd];
  return size == 2 * split.half ? Extent::Whole : size == split.half ? Extent::Half : size == 1 ? Extent::One : Extent::Other;
}

/// `shape` with the split dimension as two: [2, h] for the whole, [1, h]
/// for one half (`oneHalf`, or a value a half long), [1, 1] for a broadcast.
SmallVector<int64_t> splitShape(ArrayRef<int64_t> shape, HalfSplit split, bool oneHalf) {
  if (static_cast<int64_t>(shape.size()) <= split.fromEnd)
    return SmallVector<int64_t>(shape);
  size_t d = shape.size() - 1 - split.fromEnd;
  SmallVector<int64_t> out(shape.begin(), shape.begin() + d);
  if (shape[d] == 1)
    out.append({1, 1});
  else
    out.append({shape[d] == 2 * split.half && !oneHalf ? 2 : 1, split.half});
  out.append(shape.begin() + d + 1, shape.end());
  return out;
}

/// The shape of the half index, the bool tensor that is true at the second
/// half (which half an element is in, for a kernel's concatenations):
/// [2, 1] and a 1 for each dimension after the split one.
SmallVector<int64_t> halfIndexShape(HalfSplit split) {
  SmallVector<int64_t> shape{2, 1};
  shape.append(split.fromEnd, 1);
  return shape;
}

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
  explicit PointwiseFuser(func::FuncOp func) : body(func.getBody().front()) {
    for (auto [i, op] : llvm::enumerate(body)) {
      index[&op] = i;
      for (Value result : op.getResults())
        (void)strides.of(result); // in program order: no deep recursion later
    }
    // NCCL's staging: only CUDA steps fuse.
    Step step{func, nullptr, nullptr};
    live = walkSchedule(step, /*gloo=*/false, /*hostIsDevice=*/false, Frees::AfterLastUse).timeline;
    peak = live.empty() ? 0 : *llvm::max_element(live);
  }

  void run() {
    for (Operation &op : body) {
      auto aten = dyn_cast<AtenOp>(op);
      if (!aten || (!pointwiseRefusal(aten).empty() && !halfSplitOf(aten)))
        continue;
      if (!joinProducerGroups(aten) && !joinSiblingGroup(aten) && fits({aten})) {
        groups.push_back(std::make_unique<Group>());
        add(*groups.back(), aten);
        groups.back()->anchor = aten;
      }
    }
    for (auto &group : groups) {
      if (group->members.size() < 2 || handsOutAView(*group))
        continue;
      FailureOr<std::optional<HalfSplit>> split = splitOf(group->members);
      if (succeeded(split) && *split) {
        if (fits(group->members, /*complete=*/true))
          rewriteSplit(*group, **split);
      } else if (succeeded(split) && !growsPastItsInputs(*group)) {
        rewrite(*group);
      }
    }
    for (auto consumer : llvm::make_early_inc_range(body.getOps<PointwiseOp>()))
      for (unsigned input = 0; input < consumer.getInputs().size();)
        if (!recomputeInside(consumer, input))
          ++input;
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

  /// A kernel runs over its inputs' broadcast shape: a group whose results
  /// are larger (an expand of all it reads, adaptive average pooling's
  /// gradient) stays calls, as cheap, since the expand is a view. A group
  /// grows through such states (RMSNorm's backward, before it reads x).
  bool growsPastItsInputs(Group &group) {
    auto [inputs, outputs] = boundary(group.members);
    std::optional<SmallVector<int64_t>> read = SmallVector<int64_t>();
    for (Value input : inputs)
      if (read)
        read = broadcastShape(*read, shapeOf(input));
    return !read || ArrayRef<int64_t>(*read) != shapeOf(outputs.front());
  }

  void add(Group &group, AtenOp op) {
    group.members.push_back(op);
    group.memberSet.insert(op);
    groupOf[op] = &group;
  }

  /// Calls moving to one place, `to` (an index), and the group they make
  /// there.
  struct Move {
    SmallVector<Operation *> moved;
    int64_t to;
    llvm::SmallPtrSet<Operation *, 16> group;
  };

  /// `calls` (in program order) moving down to the last, one group there.
  Move sinking(ArrayRef<AtenOp> calls) {
    Move move{{}, index[calls.back()], {}};
    for (AtenOp call : calls) {
      move.group.insert(call);
      if (call != calls.back())
        move.moved.push_back(call);
    }
    return move;
  }

  /// `op` moving up to `group`'s place, joining it.
  Move hoisting(AtenOp op, Group &group) {
    Move move{{op}, index[group.anchor], {}};
    move.group.insert(group.memberSet.begin(), group.memberSet.end());
    move.group.insert(op);
    return move;
  }

  /// The value whose storage `value` reads: itself, or what it views.
  static Value storageOf(Value value) {
    while (isViewOf(value.getDefiningOp()))
      value = value.getDefiningOp()->getOperand(0);
    return value;
  }

  /// Where a storage is live (indices, inclusive) and its bytes there.
  struct Lifetime {
    int64_t from, last, bytes;
  };

  /// Where `storage` is live and its bytes, now or
  /// after `move` (null: now), under the memory model's rules as
  /// plan-lifetimes will release it (walkSchedule with Frees::AfterLastUse):
  /// from its definition to its last reader, never allocated when only its
  /// own group reads it (inside a kernel). Null for state that outlives
  /// the step (arguments, shards).
  std::optional<Lifetime> lifetime(Value storage, const Move *move) {
    Operation *def = storage.getDefiningOp();
    if (!def || !(computesStorage(def) || isa<WaitOp>(def)))
      return std::nullopt;
    auto at = [&](Operation *op) {
      return move && llvm::is_contained(move->moved, op) ? move->to : position(op);
    };
    const llvm::SmallPtrSetImpl<Operation *> *group = nullptr;
    if (move && move->group.contains(def))
      group = &move->group;
    else if (auto it = groupOf.find(def); it != groupOf.end())
      group = &it->second->memberSet;
    int64_t from = at(def), last = from, end = int64_t(live.size()) - 1;
    bool allocated = !group || group->size() < 2; // a group of one call stays a call
    for (Value alias : viewClosure(storage))
      for (Operation *user : alias.getUsers()) {
        if (handsOverPastStep(user))
          last = end;
        Operation *top = body.findAncestorOpInBlock(*user);
        last = std::max(last, at(top));
        allocated |= group && !group->contains(top);
      }
    return Lifetime{from, last, allocated ? tensorBytes(storage.getType()) : 0};
  }

  /// How `move` changes the bytes live after each call: (first, last,
  /// bytes added) ranges of indices.
  SmallVector<std::tuple<int64_t, int64_t, int64_t>> liveChange(const Move &move) {
    SetVector<Value> storages;
    for (Operation *op : move.group) {
      for (Value input : cast<AtenOp>(op).getInputs())
        storages.insert(storageOf(input));
      storages.insert(storageOf(op->getResult(0)));
    }
    std::map<int64_t, int64_t> change; // index -> bytes added from there on
    for (Value storage : storages) {
      auto before = lifetime(storage, nullptr), after = lifetime(storage, &move);
      if (!before)
        continue;
      change[before->from] -= before->bytes;
      change[before->last + 1] += before->bytes;
      change[after->from] += after->bytes;
      change[after->last + 1] -= after->bytes;
    }
    SmallVector<std::tuple<int64_t, int64_t, int64_t>> ranges;
    int64_t added = 0;
    for (auto it = change.begin(); it != change.end(); ++it) {
      added += it->second;
      auto next = std::next(it);
      if (added != 0 && next != change.end())
        ranges.push_back({it->first, next->first - 1, added});
    }
    return ranges;
  }

  /// Makes `move` unless it would take the bytes live anywhere above the
  /// step's peak before fusion: a kernel holds the operands of all its calls
  /// until it runs, and its results from where it runs, so moving calls can
  /// raise the peak (a product sunk to its consumer across a weight
  /// gradient keeps both its operands alive there).
  bool keepsPeak(const Move &move) {
    SmallVector<std::tuple<int64_t, int64_t, int64_t>> ranges = liveChange(move);
    for (auto [first, last, added] : ranges)
      if (added > 0)
        for (int64_t i = first; i <= last; ++i)
          if (live[i] + added > peak)
            return false;
    for (auto [first, last, added] : ranges)
      for (int64_t i = first; i <= last; ++i)
        live[i] += added;
    return true;
  }

  /// Orders groups by where they run, the latest first.
  void latestFirst(SmallVectorImpl<Group *> &groups) {
    llvm::sort(groups, [&](Group *a, Group *b) { return index[a->anchor] > index[b->anchor]; });
  }

  /// Joins `op` to the groups that produce its operands: all of them merged
  /// and moved down to `op`; else the latest one that `op` fits, moved down
  /// to `op` or with `op` moved up to it; never where that raises the peak.
  bool joinProducerGroups(AtenOp op) {
    SmallVector<Group *> candidates;
    for (Value input : op.getInputs())
      if (auto it = groupOf.find(input.getDefiningOp()); it != groupOf.end() && !llvm::is_contained(candidates, it->second))
        candidates.push_back(it->second);
    latestFirst(candidates);
    if (candidates.size() > 1) {
      SmallVector<AtenOp> merged;
      for (Group *group : candidates)
        llvm::append_range(merged, group->members);
      llvm::sort(merged, [&](AtenOp a, AtenOp b) { return index[a] < index[b]; });
      merged.push_back(op);
      if (canSinkTo(merged, op) && fits(merged) && keepsPeak(sinking(merged))) {
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
      if (canSinkTo(members, op) && keepsPeak(sinking(members))) {
        add(*group, op);
        group->anchor = op;
        return true;
      }
      if (canHoistTo(op, *group) && keepsPeak(hoisting(op, *group))) {
        add(*group, op);
        return true;
      }
    }
    return false;
  }

  /// Joins `op` to the latest group that reads one of its operands too
  /// (siblings: SwiGLU's two input gradients both read the gradient of its
  /// product), by moving `op` up to it: one kernel reads the shared tensor
  /// once. Never where that raises the peak.
  bool joinSiblingGroup(AtenOp op) {
    SmallVector<Group *> candidates;
    for (Value input : op.getInputs())
      for (Operation *user : input.getUsers())
        if (auto it = groupOf.find(user); it != groupOf.end() && !llvm::is_contained(candidates, it->second))
          candidates.push_back(it->second);
    latestFirst(candidates);
    for (Group *group : candidates) {
      SmallVector<AtenOp> members = group->members;
      members.push_back(op);
      if (fits(members) && canHoistTo(op, *group) && keepsPeak(hoisting(op, *group))) {
        add(*group, op);
        return true;
      }
    }
    return false;
  }

  /// Whether `members` may all move down to `op`'s place: nothing outside
  /// them reads their results, or frees their operands' storage (what a
  /// view operand views: a gathered parameter unsqueezed), before `op`.
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
        for (Operation *user : storageOf(input).getUsers()) {
          Operation *top = body.findAncestorOpInBlock(*user);
          if (isa<ReshardOp, ReleaseOp>(top) && index[top] > from && index[top] < to)
            return false;
        }
    }
    return true;
  }

  /// Whether `op` may move up to `group`'s place: its other operands are
  /// made before it (where their own groups run), and it is at most 16 ops
  /// later (a Llama's SwiGLU input gradients have the up projection's
  /// weight and input gradients between them; further fused nothing more).
  /// Later moves see `op` at the group's anchor (`position`), so no group
  /// it reads moves below it.
  bool canHoistTo(AtenOp op, Group &group) {
    constexpr int64_t kMostOpsAbove = 16;
    int64_t to = index[group.anchor];
    if (index[op] - to > kMostOpsAbove)
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

  /// The split a group's half slices and concatenations address: nullopt
  /// if it has none, failure if they disagree.
  static FailureOr<std::optional<HalfSplit>> splitOf(ArrayRef<AtenOp> members) {
    std::optional<HalfSplit> split;
    for (AtenOp member : members)
      if (std::optional<HalfSplit> own = halfSplitOf(member)) {
        if (split && !(*split == *own))
          return failure();
        split = own;
      }
    return split;
  }

  /// Whether `members` make one kernel: at most 8 inputs and 8 outputs,
  /// one element type, every output of the shape all values broadcast to
  /// and laid out as eager would lay it out (the kernel's TensorIterator
  /// orders the dimensions by its inputs, eager's calls by theirs). A group
  /// with half slices and concatenations may grow through states it could
  /// not be rewritten in (a half handed out, a layout eager's next call
  /// changes); `complete` asks whether it can be rewritten now.
  bool fits(ArrayRef<AtenOp> members, bool complete = false) {
    auto [inputs, outputs] = boundary(members);
    if (inputs.empty() || outputs.empty() || outputs.size() > fsdp_rt::kMostKernelTensors)
      return false;
    // One element type for the kernel's every tensor: it loads and stores
    // one storage type (a bool condition is a comparison inside).
    Type element = cast<RankedTensorType>(members.front()->getResult(0).getType()).getElementType();
    auto elementOf = [](Value value) { return cast<RankedTensorType>(value.getType()).getElementType(); };
    if (llvm::any_of(members, [&](AtenOp member) { return elementOf(member->getResult(0)) != element; }) ||
        llvm::any_of(inputs, [&](Value input) { return elementOf(input) != element; }))
      return false;
    FailureOr<std::optional<HalfSplit>> split = splitOf(members);
    if (failed(split))
      return false;
    if (*split)
      return splitFits(members, outputs, **split, complete);
    if (inputs.size() > fsdp_rt::kMostKernelTensors)
      return false;
    SmallVector<int64_t> shape;
    for (AtenOp member : members) {
      auto result = cast<RankedTensorType>(member->getResult(0).getType());
      std::optional<SmallVector<int64_t>> joined = broadcastShape(shape, result.getShape());
      if (!joined)
        return false;
      shape = *joined;
    }
    for (Value output : outputs)
      if (shapeOf(output) != ArrayRef<int64_t>(shape))
        return false;
    std::optional<Strides> fused = strides.elementwise(inputs.getArrayRef(), shape);
    if (!fused)
      return false;
    // A broadcast handed out is a view, never a kernel's output: the group
    // is not rewritten unless a later call reads it inside (handsOutAView).
    return llvm::all_of(outputs, [&](Value output) {
      if (isViewOf(output.getDefiningOp()))
        return true;
      std::optional<Strides> eager = strides.of(output);
      return eager && sameLayout(shape, *fused, *eager);
    });
  }

  /// What a kernel over split halves reads: group inputs whole (-1) or one
  /// half (0, 1), in the order the outputs' computations first read them,
  /// and whether a concatenation needs the half index.
  struct SplitReads {
    SmallVector<std::pair<Value, int>> reads;
    bool halfIndex = false;
  };

  static SplitReads splitReads(ArrayRef<AtenOp> members, ArrayRef<Value> outputs, HalfSplit split) {
    llvm::SmallPtrSet<Operation *, 16> inside;
    for (AtenOp member : members)
      inside.insert(member);
    SplitReads plan;
    DenseSet<std::pair<Value, int>> seen;
    std::function<void(Value, int)> visit = [&](Value value, int half) {
      if (extentOf(value, split) != Extent::Whole)
        half = -1; // only a whole value has halves to read
      if (!seen.insert({value, half}).second)
        return;
      Operation *def = value.getDefiningOp();
      if (!def || !inside.contains(def)) {
        plan.reads.push_back({value, half});
        return;
      }
      auto op = cast<AtenOp>(def);
      if (auto slice = halfSliceOf(op)) {
        visit(op.getInputs()[0], slice->second);
      } else if (halfConcatenationOf(op)) {
        if (half < 0) {
          visit(op.getInputs()[0], -1);
          visit(op.getInputs()[1], -1);
          plan.halfIndex = true;
        } else {
          visit(op.getInputs()[half], -1);
        }
      } else {
        for (Value operand : op.getInputs())
          visit(operand, half);
      }
    };
    for (Value output : outputs)
      visit(output, -1);
    return plan;
  }

  /// `fits` for a group with half slices and concatenations: the kernel
  /// runs over the split dimension as [2, h] (which half, where in it),
  /// reads whole inputs as views split so and halves as slices of those
  /// views, makes a concatenation of two halves a choice by the half
  /// index, and views its results back; eager's layout is checked on that.
  bool splitFits(ArrayRef<AtenOp> members, ArrayRef<Value> outputs, HalfSplit split, bool complete) {
    for (AtenOp member : members) {
      if (halfSliceOf(member)) {
        if (extentOf(member.getInputs()[0], split) != Extent::Whole)
          return false;
        continue;
      }
      if (halfConcatenationOf(member)) {
        if (extentOf(member.getInputs()[0], split) != Extent::Half)
          return false;
        continue;
      }
      Extent result = extentOf(member->getResult(0), split);
      if (result == Extent::Other)
        return false;
      for (Value operand : member.getInputs()) {
        Extent extent = extentOf(operand, split);
        if (extent != result && extent != Extent::One && extent != Extent::Outside)
          return false; // a whole value with a half one
      }
    }
    SplitReads plan = splitReads(members, outputs, split);
    if (plan.reads.size() + plan.halfIndex > fsdp_rt::kMostKernelTensors)
      return false;
    SmallVector<Value> whole;
    for (Value output : outputs) {
      if (isViewOf(output.getDefiningOp()) || extentOf(output, split) != Extent::Whole) {
        if (complete)
          return false; // handed out as it stands: a view, or a half
        continue;
      }
      whole.push_back(output);
    }
    if (whole.empty())
      return !complete;
    ArrayRef<int64_t> shape = shapeOf(whole.front());
    if (llvm::any_of(whole, [&](Value output) { return shapeOf(output) != shape; }))
      return false;
    SmallVector<int64_t> kernelShape = splitShape(shape, split, /*oneHalf=*/false);
    std::vector<std::pair<SmallVector<int64_t>, Strides>> read;
    for (auto [value, half] : plan.reads) {
      // A half is a slice of the split view: its strides, one step long there.
      std::optional<Strides> eager = strides.of(value);
      std::optional<Strides> viewed =
          eager ? viewStrides(shapeOf(value), *eager, splitShape(shapeOf(value), split, /*oneHalf=*/false))
                : std::nullopt;
      if (!viewed)
        return false;
      read.push_back({splitShape(shapeOf(value), split, /*oneHalf=*/half >= 0), *viewed});
    }
    if (plan.halfIndex) {
      SmallVector<int64_t> index = halfIndexShape(split);
      read.push_back({index, contiguousStrides(index)});
    }
    SmallVector<StridedOperand> operands;
    for (auto &[readShape, readStrides] : read)
      operands.push_back({readShape, readStrides});
    std::optional<Strides> merged =
        viewStrides(kernelShape, elementwiseResultStrides(kernelShape, operands), shape);
    for (Value output : whole) {
      std::optional<Strides> eager = strides.of(output);
      if (complete && !(merged && eager && sameLayout(shape, *merged, *eager)))
        return false; // until a later call makes eager's layout the kernel's
    }
    return true;
  }

  /// The half index for `split`'s rank of trailing dimensions, 0 or 1 in
  /// the kernel's element type: made once per function and type, at its
  /// start (an identity matrix's second column).
  Value halfIndexFor(HalfSplit split, Type element) {
    if (auto it = halfIndexes.find({split.fromEnd, element}); it != halfIndexes.end())
      return it->second;
    OpBuilder builder(&body, body.begin());
    Location loc = body.getParentOp()->getLoc();
    auto identity = AtenOp::create(
        builder, loc, TypeRange{RankedTensorType::get({2, 2}, element)}, builder.getStringAttr("aten::eye"),
        ValueRange{},
        builder.getArrayAttr({builder.getI64IntegerAttr(2), TypeAttr::get(element), builder.getStringAttr("strided"),
                              builder.getStringAttr("<device>"), builder.getBoolAttr(false)}),
        UnitAttr(), StringAttr(), IntegerAttr());
    Value index = sliceOf(builder, loc, identity->getResult(0), 1, 1, StringAttr());
    SmallVector<int64_t> shape = halfIndexShape(split);
    if (shapeOf(index) != ArrayRef<int64_t>(shape))
      index = createView(builder, loc, index, shape, StringAttr());
    return halfIndexes[{split.fromEnd, element}] = index;
  }

  /// `value[..., start:start + 1, ...]` in dimension `dim`.
  static Value sliceOf(OpBuilder &builder, Location loc, Value value, int64_t dim, int64_t start, StringAttr module) {
    auto type = cast<RankedTensorType>(value.getType());
    SmallVector<int64_t> shape(type.getShape());
    shape[dim] = 1;
    return AtenOp::create(builder, loc, TypeRange{RankedTensorType::get(shape, type.getElementType())},
                          builder.getStringAttr("aten::slice.Tensor"), ValueRange{value},
                          builder.getArrayAttr({builder.getIndexAttr(0), builder.getI64IntegerAttr(dim),
                                                builder.getI64IntegerAttr(start), builder.getI64IntegerAttr(start + 1),
                                                builder.getI64IntegerAttr(1)}),
                          UnitAttr(), module, IntegerAttr())
        ->getResult(0);
  }

  /// `value` viewed with the split dimension as [2, h] (half -1), or one
  /// half of that view: made once per function, where `value` is made, so
  /// that the kernels of every layer share the rotary tables' views.
  Value splitRead(Value value, HalfSplit split, int half) {
    Value &read = splitReads_[{value, split.fromEnd, half}];
    if (read)
      return read;
    OpBuilder builder(value.getContext());
    if (Operation *def = value.getDefiningOp())
      builder.setInsertionPointAfter(def);
    else
      builder.setInsertionPointToStart(&body);
    StringAttr module;
    if (auto aten = value.getDefiningOp<AtenOp>())
      module = aten.getModuleAttr();
    SmallVector<int64_t> shape = splitShape(shapeOf(value), split, /*oneHalf=*/false);
    if (half < 0)
      read = shape == shapeOf(value) ? value : createView(builder, value.getLoc(), value, shape, module);
    else {
      Value whole = splitRead(value, split, -1);
      builder.setInsertionPointAfterValue(whole);
      read = sliceOf(builder, value.getLoc(), whole, static_cast<int64_t>(shape.size()) - 2 - split.fromEnd, half,
                     module);
    }
    return read;
  }

  /// Rewrites a group with half slices and concatenations (see splitFits).
  void rewriteSplit(Group &group, HalfSplit split) {
    SmallVector<Value> outputs = boundary(group.members).second;
    SplitReads plan = splitReads(group.members, outputs, split);
    Type element = cast<RankedTensorType>(outputs.front().getType()).getElementType();
    Value halfIndex = plan.halfIndex ? halfIndexFor(split, element) : Value();
    OpBuilder builder(group.anchor);
    Location loc = locationOf(group);
    StringAttr module = group.members.front().getModuleAttr();
    SmallVector<Value> kernelInputs;
    for (auto [value, half] : plan.reads)
      kernelInputs.push_back(splitRead(value, split, half));
    if (halfIndex)
      kernelInputs.push_back(halfIndex);
    auto splitType = [&](Value value, bool oneHalf) {
      auto type = cast<RankedTensorType>(value.getType());
      return RankedTensorType::get(splitShape(type.getShape(), split, oneHalf), type.getElementType());
    };
    SmallVector<Type> resultTypes;
    for (Value output : outputs)
      resultTypes.push_back(splitType(output, false));
    auto fused = PointwiseOp::create(builder, loc, resultTypes, kernelInputs, module);
    Block *kernel = builder.createBlock(&fused.getBody());
    DenseMap<std::pair<Value, int>, Value> built;
    for (auto [read, input] : llvm::zip(plan.reads, kernelInputs))
      built[read] = kernel->addArgument(input.getType(), read.first.getLoc());
    Value halfIndexArg = halfIndex ? kernel->addArgument(halfIndex.getType(), loc) : Value();
    Value secondHalf; // the condition of the concatenations: halfIndexArg != 0, computed once
    auto inSecondHalf = [&]() {
      if (!secondHalf) {
        auto index = cast<RankedTensorType>(halfIndex.getType());
        secondHalf = AtenOp::create(builder, loc, TypeRange{RankedTensorType::get(index.getShape(),
                                                                                  builder.getI1Type())},
                                    builder.getStringAttr("aten::ne.Scalar"), ValueRange{halfIndexArg},
                                    builder.getArrayAttr({builder.getIndexAttr(0), builder.getI64IntegerAttr(0)}),
                                    UnitAttr(), module, IntegerAttr())
                         ->getResult(0);
      }
      return secondHalf;
    };
    std::function<Value(Value, int)> build = [&](Value value, int half) -> Value {
      if (extentOf(value, split) != Extent::Whole)
        half = -1;
      if (auto it = built.find({value, half}); it != built.end())
        return it->second;
      auto op = cast<AtenOp>(value.getDefiningOp());
      Value result;
      if (auto slice = halfSliceOf(op)) {
        result = build(op.getInputs()[0], slice->second);
      } else if (halfConcatenationOf(op) && half >= 0) {
        result = build(op.getInputs()[half], -1);
      } else if (halfConcatenationOf(op)) {
        Value first = build(op.getInputs()[0], -1), second = build(op.getInputs()[1], -1);
        result = AtenOp::create(builder, op.getLoc(), TypeRange{splitType(value, false)},
                                builder.getStringAttr("aten::where.self"), ValueRange{inSecondHalf(), second, first},
                                ArrayAttr(), UnitAttr(), op.getModuleAttr(), IntegerAttr())
                     ->getResult(0);
      } else {
        SmallVector<Value> operands;
        for (Value operand : op.getInputs())
          operands.push_back(build(operand, half));
        auto copy = cast<AtenOp>(builder.clone(*op));
        copy->setOperands(operands);
        auto type = splitType(value, half >= 0);
        copy->getResult(0).setType(type);
        if (copy.getCallee() == "aten::expand") {
          SmallVector<Attribute> args(copy.getArgsAttr().getValue());
          args[1] = integerListAttr(builder, type.getShape());
          copy.setArgsAttr(builder.getArrayAttr(args));
        }
        result = copy->getResult(0);
      }
      return built[{value, half}] = result;
    };
    SmallVector<Value> yielded;
    for (Value output : outputs)
      yielded.push_back(build(output, -1));
    YieldOp::create(builder, fused.getLoc(), yielded);
    builder.setInsertionPointAfter(fused);
    SmallVector<Value> viewedBack;
    for (auto [output, result] : llvm::zip(outputs, fused.getResults()))
      viewedBack.push_back(createView(builder, loc, result, shapeOf(output), module));
    replaceGroup(group, outputs, viewedBack);
  }

  /// Where a kernel comes from: all its calls' locations.
  static Location locationOf(Group &group) {
    return FusedLoc::get(group.anchor->getContext(),
                         llvm::map_to_vector(group.members, [](AtenOp member) { return member.getLoc(); }));
  }

  /// Reads `replacements` (one per output) wherever the group's outputs
  /// were read outside it, and erases its calls.
  static void replaceGroup(Group &group, ArrayRef<Value> outputs, ArrayRef<Value> replacements) {
    for (auto [output, replacement] : llvm::zip(outputs, replacements))
      Value(output).replaceUsesWithIf(replacement,
                               [&](OpOperand &use) { return !group.memberSet.contains(use.getOwner()); });
    for (AtenOp member : llvm::reverse(group.members))
      member->erase();
  }

  void rewrite(Group &group) {
    auto [inputs, outputs] = boundary(group.members);
    OpBuilder builder(group.anchor);
    SmallVector<Type> resultTypes;
    for (Value output : outputs)
      resultTypes.push_back(output.getType());
    auto fused = PointwiseOp::create(builder, locationOf(group), resultTypes, inputs.getArrayRef(),
                                     group.members.front().getModuleAttr());
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
    replaceGroup(group, outputs, SmallVector<Value>(fused.getResults()));
  }

  /// Where `consumer`'s input `input` is another kernel's result computed
  /// only from tensors `consumer` reads too (SwiGLU's gradient kernel reads
  /// the recomputed silu(gate) beside gate), computes it inside instead:
  /// one tensor fewer read, and one fewer written where nothing else reads
  /// it. Lifetimes of other tensors do not change.
  static bool recomputeInside(PointwiseOp consumer, unsigned input) {
    Value read = consumer.getInputs()[input];
    auto producer = read.getDefiningOp<PointwiseOp>();
    if (!producer)
      return false;
    unsigned output = cast<OpResult>(read).getResultNumber();
    Block &from = producer.getBody().front(), &into = consumer.getBody().front();
    Value yielded = from.getTerminator()->getOperand(output);
    SetVector<Operation *> calls; // what computes `yielded`, in body order once sorted
    SmallVector<Value> pending{yielded};
    IRMapping map;
    while (!pending.empty()) {
      Value value = pending.pop_back_val();
      if (auto argument = dyn_cast<BlockArgument>(value)) {
        Value outside = producer.getInputs()[argument.getArgNumber()];
        auto same = llvm::find_if(llvm::enumerate(consumer.getInputs()), [&](auto entry) {
          return entry.index() != input && entry.value() == outside;
        });
        if (same == llvm::enumerate(consumer.getInputs()).end())
          return false; // it would read a tensor it does not read now
        map.map(argument, into.getArgument((*same).index()));
      } else if (calls.insert(value.getDefiningOp())) {
        llvm::append_range(pending, value.getDefiningOp()->getOperands());
      }
    }
    SmallVector<Operation *> ordered(calls.begin(), calls.end());
    llvm::sort(ordered, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    OpBuilder builder(&into, into.begin());
    for (Operation *call : ordered)
      builder.clone(*call, map);
    into.getArgument(input).replaceAllUsesWith(map.lookup(yielded));
    into.eraseArgument(input);
    consumer->eraseOperand(input);
    if (read.use_empty())
      dropResult(producer, output);
    return true;
  }

  /// `producer` without its result `output` (nothing reads it), and without
  /// the calls that computed only it.
  static void dropResult(PointwiseOp producer, unsigned output) {
    SmallVector<Type> types;
    for (OpResult result : producer.getResults())
      if (result.getResultNumber() != output)
        types.push_back(result.getType());
    if (types.empty()) {
      producer->erase();
      return;
    }
    OpBuilder builder(producer);
    auto kept = PointwiseOp::create(builder, producer.getLoc(), types, producer.getInputs(),
                                    producer.getModuleAttr());
    kept.getBody().takeBody(producer.getBody());
    Block &kernel = kept.getBody().front();
    kernel.getTerminator()->eraseOperand(output);
    unsigned next = 0;
    for (OpResult result : producer.getResults())
      if (result.getResultNumber() != output)
        result.replaceAllUsesWith(kept.getResult(next++));
    producer->erase();
    // Last to first, so that a call's operands are unused once it is gone. (A
    // reverse early-increment range would hold an iterator to the erased call.)
    for (Operation *call = kernel.getTerminator()->getPrevNode(); call;) {
      Operation *previous = call->getPrevNode();
      if (call->use_empty())
        call->erase();
      call = previous;
    }
  }

  Block &body;
  DenseMap<Operation *, int64_t> index;
  SmallVector<int64_t> live; // bytes the step allocated, live after each call, with the groups' moves
  int64_t peak = 0;          // the most before fusion
  EagerStrides strides;
  DenseMap<std::pair<int64_t, Type>, Value> halfIndexes; // per trailing rank of a split and element type
  DenseMap<std::tuple<Value, int64_t, int>, Value> splitReads_; // (value, split's rank from the end, half)
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
        PointwiseFuser(func).run();
  }
};

} // namespace
