//===- PointwiseKernel.cpp - an fsdp.pointwise body as CUDA source --------===//
//
// Prints what fsdp-fuse-pointwise decided; decides nothing. The body
//
//   ^bb0(%a: tensor<8x64xbf16>, %b: tensor<8x1xbf16>):
//     %r = fsdp.aten "aten::rsqrt"(%b) ...
//     %n = fsdp.aten "aten::mul.Tensor"(%a, %r) ...
//     fsdp.yield %n ...
//
// becomes, after the helpers,
//
//   template <typename T> void fsdp_pointwise_0(T in0, T in1, T& out0) {
//     const float a0 = static_cast<float>(in0);
//     const float a1 = static_cast<float>(in1);
//     const float v0 = rsqrtf(a1);
//     const float v1 = (a0 * v0);
//     out0 = static_cast<T>(v1);
//   }
//
// which PyTorch's jiterator wraps in an elementwise kernel (broadcasting,
// strides, vectorized loads) and compiles with NVRTC (-default-device), T
// being float for f32, bf16 and f16 tensors. Each element's arithmetic
// comes from the one table in fsdp/Dialect/Pointwise.h.
//
// Test: test/Target/fsdp-to-program-kernels.mlir and
// python/tests/test_pointwise_kernels.py, which compiles every kernel
// with NVRTC and runs each rule's source on the host against ATen.
//
//===----------------------------------------------------------------------===//

#include "PointwiseKernel.h"

#include "fsdp/Dialect/Pointwise.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/raw_ostream.h"

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
    {"fsdp_sigmoid", "inline float fsdp_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\n"},
    {"fsdp_relu", "inline float fsdp_relu(float x) { return x <= 0.0f ? 0.0f : x; }\n"},
    {"fsdp_silu_backward", R"(inline float fsdp_silu_backward(float g, float x) {
  const float s = fsdp_sigmoid(x);
  return g * s * (1.0f + x * (1.0f - s));
}
)"},
    {"fsdp_gelu", "inline float fsdp_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.707106781f)); }\n"},
    {"fsdp_gelu_backward", R"(inline float fsdp_gelu_backward(float g, float x) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.707106781f));
  const float pdf = expf(-0.5f * x * x) * 0.398942280f;
  return g * (cdf + x * pdf);
}
)"},
    {"fsdp_gelu_tanh", R"(inline float fsdp_gelu_tanh(float x) {
  const float inner = 0.797884561f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}
)"},
    {"fsdp_gelu_tanh_backward", R"(inline float fsdp_gelu_tanh_backward(float g, float x) {
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

std::string mlir::fsdp::pointwiseKernelSource(PointwiseOp op, StringRef name) {
  std::string source;
  llvm::raw_string_ostream os(source);
  Block &body = op.getBody().front();
  os << "template <typename T> void " << name << "(";
  for (unsigned i = 0; i < body.getNumArguments(); ++i)
    os << (i ? ", " : "") << "T in" << i;
  for (unsigned i = 0; i < op.getNumResults(); ++i)
    os << ", T& out" << i;
  os << ") {\n";
  llvm::DenseMap<Value, std::string> names;
  for (BlockArgument arg : body.getArguments()) {
    std::string variable = "a" + std::to_string(arg.getArgNumber());
    os << "  const float " << variable << " = static_cast<float>(in" << arg.getArgNumber() << ");\n";
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
    os << "  out" << i << " = static_cast<T>(" << names.lookup(value) << ");\n";
  os << "}\n";
  return helpersFor(source) + source;
}
