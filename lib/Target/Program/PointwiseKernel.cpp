//===- PointwiseKernel.cpp - an fsdp.pointwise as a kernel entry ----------===//
//
// Prints what fsdp-fuse-pointwise decided and lays out the loop. The body
//
//   ^bb0(%a: tensor<8x64xbf16>, %b: tensor<8x1xbf16>):
//     %r = fsdp.aten "aten::rsqrt"(%b) ...
//     %n = fsdp.aten "aten::mul.Tensor"(%a, %r) ...
//     fsdp.yield %n ...
//
// becomes, after the helpers, the element function
//
//   __device__ __forceinline__ void fsdp_pointwise_0(float in0, float in1, float& out0) {
//     const float a0 = in0;
//     const float a1 = in1;
//     const float v0 = rsqrtf(a1);
//     const float v1 = (a0 * v0);
//     out0 = v1;
//   }
//
// computing in float for f32, bf16 and f16 tensors, as ATen's opmath does
// (each element's arithmetic from the one table in fsdp/Dialect/Pointwise.h),
// and the layout: extents [64, 8] (innermost first), %a's steps [1, 64],
// %b's [0, 1] (broadcast along the rows), the output's [1, 64], 8 bf16
// elements (16 bytes) per thread and iteration. The runtime prints the loop
// around the element function from the layout (fsdp_rt/Kernels.h).
//
// Test: test/Target/fsdp-to-program-kernels.mlir and
// python/tests/test_pointwise_kernels.py, which compiles every kernel with
// NVRTC through the runtime and runs whole kernels on the host against ATen.
//
//===----------------------------------------------------------------------===//

#include "PointwiseKernel.h"

#include "fsdp/Dialect/Pointwise.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <limits>

using namespace mlir;
using namespace mlir::fsdp;

namespace {

/// Helpers the table's expressions call, in float, each written out once (no
/// header is included: NVRTC provides expf, erff, tanhf, rsqrtf). A kernel
/// carries those its body calls, and those they call (listed earlier).
struct Helper {
  const char *name, *source;
};
constexpr Helper kHelpers[] = {
    {"fsdp_sigmoid", "__device__ inline float fsdp_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\n"},
    {"fsdp_relu", "__device__ inline float fsdp_relu(float x) { return x <= 0.0f ? 0.0f : x; }\n"},
    {"fsdp_silu_backward", R"(__device__ inline float fsdp_silu_backward(float g, float x) {
  const float s = fsdp_sigmoid(x);
  return g * s * (1.0f + x * (1.0f - s));
}
)"},
    {"fsdp_gelu", "__device__ inline float fsdp_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.707106781f)); }\n"},
    {"fsdp_gelu_backward", R"(__device__ inline float fsdp_gelu_backward(float g, float x) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.707106781f));
  const float pdf = expf(-0.5f * x * x) * 0.398942280f;
  return g * (cdf + x * pdf);
}
)"},
    {"fsdp_gelu_tanh", R"(__device__ inline float fsdp_gelu_tanh(float x) {
  const float inner = 0.797884561f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}
)"},
    {"fsdp_gelu_tanh_backward", R"(__device__ inline float fsdp_gelu_tanh_backward(float g, float x) {
  const float t = tanhf(0.797884561f * (x + 0.044715f * x * x * x));
  const float inner_grad = 0.797884561f * (1.0f + 3.0f * 0.044715f * x * x);
  return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * inner_grad);
}
)"},
};

/// The helpers `code` calls, directly or through other helpers, in order.
std::string helpersFor(const std::string &code) {
  std::string needed = code;
  SmallVector<bool> used(std::size(kHelpers), false);
  for (size_t i = std::size(kHelpers); i-- > 0;)
    if (needed.find(std::string(kHelpers[i].name) + "(") != std::string::npos) {
      used[i] = true;
      needed += kHelpers[i].source;
    }
  std::string out;
  for (size_t i = 0; i < std::size(kHelpers); ++i)
    if (used[i])
      out += kHelpers[i].source;
  return out;
}

} // namespace

std::string mlir::fsdp::pointwiseElementSource(PointwiseOp op, StringRef name) {
  std::string source;
  llvm::raw_string_ostream os(source);
  Block &body = op.getBody().front();
  os << "__device__ __forceinline__ void " << name << "(";
  for (unsigned i = 0; i < body.getNumArguments(); ++i)
    os << (i ? ", " : "") << "float in" << i;
  for (unsigned i = 0; i < op.getNumResults(); ++i)
    os << ", float& out" << i;
  os << ") {\n";
  llvm::DenseMap<Value, std::string> names;
  for (BlockArgument arg : body.getArguments()) {
    std::string variable = "a" + std::to_string(arg.getArgNumber());
    os << "  const float " << variable << " = in" << arg.getArgNumber() << ";\n";
    names[arg] = variable;
  }
  unsigned next = 0;
  for (Operation &inner : body.without_terminator()) {
    auto aten = cast<AtenOp>(inner);
    SmallVector<std::string> operands;
    for (Value input : aten.getInputs())
      operands.push_back(names.lookup(input));
    std::string variable = "v" + std::to_string(next++);
    os << "  const float " << variable << " = " << pointwiseExpression(aten, operands) << ";\n";
    names[aten->getResult(0)] = variable;
  }
  for (auto [i, value] : llvm::enumerate(op.getYield().getValues()))
    os << "  out" << i << " = " << names.lookup(value) << ";\n";
  os << "}\n";
  return helpersFor(source) + source;
}

FailureOr<KernelLayout> mlir::fsdp::pointwiseKernelLayout(PointwiseOp op, EagerStrides &strides) {
  auto resultType = cast<RankedTensorType>(op.getResults().front().getType());
  ArrayRef<int64_t> shape = resultType.getShape();
  for (Type result : op.getResultTypes())
    if (cast<RankedTensorType>(result).getShape() != shape)
      return op.emitOpError("fsdp-to-program: a kernel's outputs have one shape");
  std::optional<Strides> outStrides = strides.elementwise(op.getInputs(), shape);
  if (!outStrides)
    return op.emitOpError("fsdp-to-program: the strides of this kernel's inputs are not known, so its loop cannot be laid out");
  const size_t rank = shape.size();

  // Every tensor's steps along the result's dimensions.
  KernelLayout layout;
  SmallVector<Strides> steps;
  for (Value input : op.getInputs()) {
    ArrayRef<int64_t> inShape = cast<RankedTensorType>(input.getType()).getShape();
    Strides inStrides = *strides.of(input); // known: elementwise() read them
    Strides aligned(rank, 0);
    size_t offset = rank - inShape.size();
    for (size_t d = 0; d < inShape.size(); ++d)
      aligned[offset + d] = inShape[d] == 1 && shape[offset + d] != 1 ? 0 : inStrides[d];
    steps.push_back(aligned);
    layout.inputs.push_back({SmallVector<int64_t>(inShape), SmallVector<int64_t>(inStrides), {}});
  }
  for (size_t i = 0; i < op.getNumResults(); ++i) {
    steps.push_back(*outStrides);
    layout.outputs.push_back({SmallVector<int64_t>(shape), SmallVector<int64_t>(*outStrides), {}});
  }

  // The loop's dimensions, innermost first in the outputs' order; a
  // dimension joins the one inside it where every tensor steps across both
  // as across one.
  SmallVector<int64_t> order;
  for (size_t d = 0; d < rank; ++d)
    if (shape[d] != 1)
      order.push_back(static_cast<int64_t>(d));
  llvm::stable_sort(order, [&](int64_t a, int64_t b) { return (*outStrides)[a] < (*outStrides)[b]; });
  SmallVector<SmallVector<int64_t>> loopSteps(steps.size());
  for (int64_t d : order) {
    bool joins = !layout.extents.empty();
    for (size_t t = 0; joins && t < steps.size(); ++t)
      joins = steps[t][d] == loopSteps[t].back() * layout.extents.back();
    if (joins) {
      layout.extents.back() *= shape[d];
      continue;
    }
    layout.extents.push_back(shape[d]);
    for (size_t t = 0; t < steps.size(); ++t)
      loopSteps[t].push_back(steps[t][d]);
  }
  if (layout.extents.empty()) { // one element
    layout.extents.push_back(1);
    for (SmallVector<int64_t> &tensorSteps : loopSteps)
      tensorSteps.push_back(0);
  }
  for (size_t t = 0; t < steps.size(); ++t) {
    KernelOperandLayout &operand =
        t < layout.inputs.size() ? layout.inputs[t] : layout.outputs[t - layout.inputs.size()];
    operand.steps = loopSteps[t];
  }

  // 16 bytes per thread and iteration, or the widest power of two that
  // divides the innermost dimension.
  int64_t bytes = std::max<int64_t>(1, resultType.getElementTypeBitWidth() / 8);
  layout.vector = 16 / bytes;
  while (layout.vector > 1 && layout.extents.front() % layout.vector != 0)
    layout.vector /= 2;
  int64_t elements = 1;
  for (int64_t extent : layout.extents)
    elements *= extent;
  int64_t iterations = elements / layout.vector;
  layout.grid = std::clamp<int64_t>((iterations + layout.block - 1) / layout.block, 1,
                                    std::numeric_limits<int32_t>::max());
  return layout;
}
