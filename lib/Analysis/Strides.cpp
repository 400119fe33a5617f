//===- Strides.cpp - the strides eager PyTorch gives a step's tensors -----===//
//
// ATen's rules, restated: `view` splits and merges runs of dimensions that
// are contiguous with each other; TensorIterator sorts an elementwise
// call's dimensions innermost first by its inputs' strides (the first
// input whose strides tell two dimensions apart decides; a broadcast
// dimension, stride 0, tells nothing) and allocates the result dense in
// that order, unless every input has the result's shape and one layout
// (then the result has it too).
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Strides.h"
#include "fsdp/Dialect/Pointwise.h"

#include "llvm/ADT/StringSwitch.h"

#include <numeric>

using namespace mlir;
using namespace mlir::fsdp;

Strides mlir::fsdp::contiguousStrides(ArrayRef<int64_t> shape) {
  Strides strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  return strides;
}

std::optional<Strides> mlir::fsdp::viewStrides(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides,
                                               ArrayRef<int64_t> newShape) {
  int64_t elements = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  if (shape.empty() || elements == 0)
    return contiguousStrides(newShape);
  Strides result(newShape.size(), 1);
  // Walk the old dimensions innermost first in runs whose elements are
  // evenly spaced ("chunks"); the new dimensions must tile each run.
  int64_t newDim = static_cast<int64_t>(newShape.size()) - 1;
  int64_t chunkStride = strides.back();
  int64_t chunkElements = 1, newElements = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    chunkElements *= shape[d];
    bool runEnds = d == 0 || (shape[d - 1] != 1 && strides[d - 1] != chunkElements * chunkStride);
    if (!runEnds)
      continue;
    while (newDim >= 0 && (newElements < chunkElements || newShape[newDim] == 1)) {
      result[newDim] = newElements * chunkStride;
      newElements *= newShape[newDim];
      --newDim;
    }
    if (newElements != chunkElements)
      return std::nullopt;
    if (d > 0) {
      chunkStride = strides[d - 1];
      chunkElements = newElements = 1;
    }
  }
  if (newDim != -1)
    return std::nullopt;
  return result;
}

namespace {

/// Whether `strides` step through `shape` densely in `order` (innermost
/// first; dimensions of size 1 are never stepped).
bool denseInOrder(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides, ArrayRef<int64_t> order) {
  int64_t expected = 1;
  for (int64_t d : order) {
    if (shape[d] == 1)
      continue;
    if (strides[d] != expected)
      return false;
    expected *= shape[d];
  }
  return true;
}

/// The dense strides of `shape` laid out in `order` (innermost first).
Strides denseStridesInOrder(ArrayRef<int64_t> shape, ArrayRef<int64_t> order) {
  Strides strides(shape.size(), 1);
  int64_t running = 1;
  for (int64_t d : order) {
    strides[d] = running;
    running *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

/// The dimensions innermost first by `strides` (stable: ties keep order).
SmallVector<int64_t, 6> byStride(ArrayRef<int64_t> strides) {
  SmallVector<int64_t, 6> order(strides.size());
  std::iota(order.begin(), order.end(), 0);
  llvm::stable_sort(order, [&](int64_t a, int64_t b) { return strides[a] < strides[b]; });
  return order;
}

/// Row-major order: the last dimension innermost.
SmallVector<int64_t, 6> rowMajorOrder(size_t rank) {
  SmallVector<int64_t, 6> order(rank);
  for (size_t i = 0; i < rank; ++i)
    order[i] = static_cast<int64_t>(rank - 1 - i);
  return order;
}

bool isContiguous(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides) {
  return denseInOrder(shape, strides, rowMajorOrder(shape.size()));
}

bool isNonOverlappingAndDense(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides) {
  return denseInOrder(shape, strides, byStride(strides));
}

/// ATen's reading of 4-d (NCHW) and 5-d strides as channels-last, which
/// makes a concatenation channels-last when every input reads so.
bool stridesLikeChannelsLast(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides) {
  SmallVector<int64_t, 5> order;
  if (shape.size() == 4)
    order = {1, 3, 2, 0};
  else if (shape.size() == 5)
    order = {1, 4, 3, 2, 0};
  else
    return false;
  if (strides[1] == 0)
    return false;
  int64_t least = 0;
  for (int64_t d : order) {
    if (shape[d] == 0 || strides[d] < least)
      return false;
    if (d == 0 && least == strides[1])
      return false;
    least = strides[d] * (shape[d] > 1 ? shape[d] : 1);
  }
  return true;
}

StringRef stringAt(AtenOp op, unsigned position) {
  ArrayAttr args = op.getArgsAttr();
  auto text = args && position < args.size() ? dyn_cast<StringAttr>(args[position]) : StringAttr();
  return text ? text.getValue() : StringRef();
}

int64_t normalized(int64_t dim, int64_t rank) { return dim < 0 ? dim + rank : dim; }

ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }

} // namespace

Strides mlir::fsdp::elementwiseResultStrides(ArrayRef<int64_t> shape, ArrayRef<StridedOperand> inputs) {
  size_t rank = shape.size();
  if (rank == 0)
    return {};
  bool sameShapes = llvm::all_of(inputs, [&](const StridedOperand &in) { return in.shape == shape; });
  if (sameShapes && !inputs.empty()) {
    if (llvm::all_of(inputs, [](const StridedOperand &in) { return isContiguous(in.shape, in.strides); }))
      return contiguousStrides(shape);
    bool oneDenseLayout = llvm::all_of(inputs, [&](const StridedOperand &in) {
      return isNonOverlappingAndDense(in.shape, in.strides) && in.strides == inputs.front().strides;
    });
    if (oneDenseLayout)
      return Strides(inputs.front().strides);
  }
  // Each input's strides against the result's dimensions: 0 where it is
  // broadcast (missing leading dimensions, or size 1 against a longer one).
  SmallVector<Strides> aligned;
  for (const StridedOperand &in : inputs) {
    Strides strides(rank, 0);
    size_t offset = rank - in.shape.size();
    for (size_t d = 0; d < in.shape.size(); ++d)
      strides[offset + d] = in.shape[d] == 1 && shape[offset + d] != 1 ? 0 : in.strides[d];
    aligned.push_back(strides);
  }
  // 1: `inner` should come after `outer` (swap); -1: it should not; 0: no input says.
  auto compare = [&](int64_t inner, int64_t outer) {
    for (const Strides &strides : aligned) {
      int64_t a = strides[inner], b = strides[outer];
      if (a == 0 || b == 0)
        continue;
      if (a < b)
        return -1;
      if (a > b)
        return 1;
      if (shape[inner] > shape[outer])
        return 1;
    }
    return 0;
  };
  SmallVector<int64_t, 6> order = rowMajorOrder(rank); // innermost first, sorted below
  for (size_t i = 1; i < rank; ++i) {
    size_t moving = i;
    for (int64_t j = static_cast<int64_t>(i) - 1; j >= 0; --j) {
      int comparison = compare(order[j], order[moving]);
      if (comparison > 0) {
        std::swap(order[j], order[moving]);
        moving = j;
      } else if (comparison < 0) {
        break;
      }
    }
  }
  return denseStridesInOrder(shape, order);
}

bool mlir::fsdp::sameLayout(ArrayRef<int64_t> shape, ArrayRef<int64_t> a, ArrayRef<int64_t> b) {
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && a[d] != b[d])
      return false;
  return true;
}

std::optional<Strides> EagerStrides::of(Value value) {
  if (!isa<RankedTensorType>(value.getType()))
    return std::nullopt;
  if (auto it = known.find(value); it != known.end())
    return it->second;
  std::optional<Strides> strides = compute(value);
  known[value] = strides;
  return strides;
}

std::optional<Strides> EagerStrides::elementwise(ValueRange inputs, ArrayRef<int64_t> shape) {
  SmallVector<Strides> strides;
  strides.reserve(inputs.size()); // the operands below point into it
  SmallVector<StridedOperand> operands;
  for (Value input : inputs) {
    if (!isa<RankedTensorType>(input.getType()))
      continue;
    std::optional<Strides> known = of(input);
    if (!known)
      return std::nullopt;
    strides.push_back(*known);
    operands.push_back({shapeOf(input), strides.back()});
  }
  return elementwiseResultStrides(shape, operands);
}

std::optional<Strides> EagerStrides::preserved(Value input) {
  std::optional<Strides> strides = of(input);
  if (!strides || !isNonOverlappingAndDense(shapeOf(input), *strides))
    return std::nullopt; // ATen infers a dense layout there: not modelled
  return strides;
}

std::optional<Strides> EagerStrides::compute(Value value) {
  Operation *op = value.getDefiningOp();
  if (!op)
    return contiguousStrides(shapeOf(value)); // the batch: the runtime hands it over row-major
  ArrayRef<int64_t> shape = shapeOf(value);
  if (isa<GetParamOp, GetBufferOp, GetAccumulatedGradOp, WaitOp, AllSliceOp>(op))
    return contiguousStrides(shape); // allocated by the runtime, row-major
  if (auto cast = dyn_cast<CastOp>(op))
    return preserved(cast.getInput());
  if (auto fused = dyn_cast<PointwiseOp>(op))
    return elementwise(fused.getInputs(), shape);
  auto aten = dyn_cast<AtenOp>(op);
  if (!aten)
    return std::nullopt;
  StringRef callee = aten.getCallee();
  ValueRange inputs = aten.getInputs();
  auto input = [&]() -> std::optional<Strides> { return inputs.empty() ? std::nullopt : of(inputs.front()); };
  int64_t inRank = inputs.empty() || !isa<RankedTensorType>(inputs.front().getType())
                       ? 0
                       : static_cast<int64_t>(shapeOf(inputs.front()).size());

  if (callee == "aten::view" || callee == "aten::_unsafe_view" || callee == "aten::reshape") {
    std::optional<Strides> from = input();
    if (!from)
      return callee == "aten::view" ? std::nullopt : std::optional<Strides>(contiguousStrides(shape));
    std::optional<Strides> viewed = viewStrides(shapeOf(inputs.front()), *from, shape);
    if (!viewed && callee != "aten::view")
      return contiguousStrides(shape); // reshape copies where it cannot view
    return viewed;
  }
  if (callee == "aten::alias")
    return input();
  if (callee == "aten::permute") {
    std::optional<Strides> from = input();
    std::optional<SmallVector<int64_t>> dims = integerListLiteral(aten, 1);
    if (!from || !dims || dims->size() != shape.size())
      return std::nullopt;
    Strides result;
    for (int64_t dim : *dims)
      result.push_back((*from)[normalized(dim, inRank)]);
    return result;
  }
  if (callee == "aten::transpose.int" || callee == "aten::t") {
    std::optional<Strides> from = input();
    if (!from || from->size() < 2)
      return from;
    int64_t a = callee == "aten::t" ? 0 : normalized(integerLiteral(aten, 1).value_or(0), inRank);
    int64_t b = callee == "aten::t" ? 1 : normalized(integerLiteral(aten, 2).value_or(1), inRank);
    std::swap((*from)[a], (*from)[b]);
    return from;
  }
  if (callee == "aten::slice.Tensor") {
    std::optional<Strides> from = input();
    int64_t dim = normalized(integerLiteral(aten, 1).value_or(0), inRank);
    if (!from || dim < 0 || dim >= inRank)
      return std::nullopt;
    (*from)[dim] *= integerLiteral(aten, 4).value_or(1);
    return from;
  }
  if (callee == "aten::select.int") {
    std::optional<Strides> from = input();
    std::optional<int64_t> dim = integerLiteral(aten, 1);
    if (!from || !dim)
      return std::nullopt;
    from->erase(from->begin() + normalized(*dim, inRank));
    return from;
  }
  if (callee == "aten::unsqueeze") {
    std::optional<Strides> from = input();
    std::optional<int64_t> dim = integerLiteral(aten, 1);
    if (!from || !dim)
      return std::nullopt;
    int64_t at = normalized(*dim, inRank + 1);
    ArrayRef<int64_t> inShape = shapeOf(inputs.front());
    int64_t stride = at < inRank ? inShape[at] * (*from)[at] : 1;
    from->insert(from->begin() + at, stride);
    return from;
  }
  if (callee == "aten::squeeze" || callee == "aten::squeeze.dim" || callee == "aten::squeeze.dims") {
    std::optional<Strides> from = input();
    if (!from)
      return std::nullopt;
    ArrayRef<int64_t> inShape = shapeOf(inputs.front());
    SmallVector<int64_t> dims;
    if (callee == "aten::squeeze.dims")
      dims = integerListLiteral(aten, 1).value_or(SmallVector<int64_t>{});
    else if (callee == "aten::squeeze.dim")
      dims = {integerLiteral(aten, 1).value_or(0)};
    else
      for (int64_t d = 0; d < inRank; ++d)
        dims.push_back(d);
    Strides result;
    for (int64_t d = 0; d < inRank; ++d)
      if (inShape[d] != 1 || !llvm::any_of(dims, [&](int64_t dim) { return normalized(dim, inRank) == d; }))
        result.push_back((*from)[d]);
    if (result.size() != shape.size())
      return std::nullopt;
    return result;
  }
  if (callee == "aten::expand") {
    std::optional<Strides> from = input();
    if (!from)
      return std::nullopt;
    ArrayRef<int64_t> inShape = shapeOf(inputs.front());
    size_t offset = shape.size() - inShape.size();
    Strides result(shape.size(), 0);
    for (size_t d = 0; d < inShape.size(); ++d)
      result[offset + d] = inShape[d] == 1 && shape[offset + d] != 1 ? 0 : (*from)[d];
    return result;
  }
  if (callee == "aten::clone" || callee == "aten::_to_copy") {
    StringRef format = stringAt(aten, callee == "aten::clone" ? 1 : 6);
    if (format == "contiguous_format")
      return contiguousStrides(shape);
    if (format.empty() || format == "preserve_format")
      return preserved(inputs.front());
    return std::nullopt;
  }
  if (callee == "aten::full_like" || callee == "aten::zeros_like" || callee == "aten::ones_like") {
    StringRef format = stringAt(aten, callee == "aten::full_like" ? 6 : 5);
    return format == "contiguous_format" ? std::optional<Strides>(contiguousStrides(shape)) : preserved(inputs.front());
  }
  if (callee == "aten::cat") {
    if (shape.size() != 4 && shape.size() != 5)
      return contiguousStrides(shape);
    // Channels-last only when every input reads channels-last.
    for (Value piece : inputs) {
      std::optional<Strides> strides = of(piece);
      if (!strides)
        return std::nullopt;
      if (!stridesLikeChannelsLast(shapeOf(piece), *strides) || isContiguous(shapeOf(piece), *strides))
        return contiguousStrides(shape);
    }
    return std::nullopt;
  }
  if (callee == "aten::_scaled_dot_product_cudnn_attention" && isa<OpResult>(value) &&
      cast<OpResult>(value).getResultNumber() == 0) {
    // The output is dense in the query's order of strides (cuDNN and its
    // meta function allocate it so; capture's views relied on the same).
    std::optional<Strides> query = input();
    if (!query)
      return std::nullopt;
    return denseStridesInOrder(shape, byStride(*query));
  }
  if (callee == "aten::_scaled_dot_product_cudnn_attention_backward" && isa<OpResult>(value) &&
      cast<OpResult>(value).getResultNumber() < 3 && inputs.size() > 3) {
    // The gradients of query, key and value are allocated like them.
    return preserved(inputs[1 + cast<OpResult>(value).getResultNumber()]);
  }
  bool rowMajor = llvm::StringSwitch<bool>(callee)
                      .Cases({"aten::mm", "aten::bmm", "aten::addmm", "aten::embedding", "aten::full", "aten::eye",
                              "aten::native_layer_norm", "aten::_softmax", "aten::_log_softmax",
                              "aten::_fused_rms_norm", "aten::_fused_rms_norm_backward"},
                             true)
                      .Default(false);
  if (rowMajor)
    return contiguousStrides(shape);
  if (callee == "aten::sum.dim_IntList" || callee == "aten::mean.dim") {
    std::optional<Strides> from = input();
    if (from && isContiguous(shapeOf(inputs.front()), *from))
      return contiguousStrides(shape);
    return std::nullopt;
  }
  if (callee == "aten::scalar_tensor")
    return Strides{}; // 0-d
  bool iterated = llvm::StringSwitch<bool>(callee)
                      .Cases({"aten::where.self", "aten::bitwise_not", "aten::logical_not", "aten::eq.Scalar",
                              "aten::ne.Scalar", "aten::lt.Scalar", "aten::le.Scalar", "aten::gt.Scalar",
                              "aten::ge.Scalar"},
                             true)
                      .Default(pointwiseRefusal(aten).empty() && !isViewOf(aten));
  if (iterated)
    return elementwise(inputs, shape);
  return std::nullopt;
}
