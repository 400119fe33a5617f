// RUN: fsdp-opt %s --fsdp-fuse-pointwise --fsdp-plan-lifetimes | fsdp-translate --fsdp-to-program | FileCheck %s

// Fused chains lower to `kernels`, each source once (the two identical
// SwiGLU chains share fsdp_pointwise_0), and `pointwise` instructions that name
// their kernel, inputs and results. The source is the jiterator's form: a
// template over T computing in float, the helpers it calls first.
module attributes {fsdp.device = "cuda"} {
func.func @two_swiglus(%a: tensor<8x64xbf16>, %b: tensor<8x64xbf16>) -> (tensor<8x64xbf16>, tensor<8x64xbf16>, tensor<8x64xbf16>) {
  %ad = fsdp.aten "aten::clone"(%a) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %bd = fsdp.aten "aten::clone"(%b) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %s = fsdp.aten "aten::silu"(%ad) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %g = fsdp.aten "aten::mul.Tensor"(%s, %bd) : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %s2 = fsdp.aten "aten::silu"(%bd) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %g2 = fsdp.aten "aten::mul.Tensor"(%s2, %ad) : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %n = fsdp.aten "aten::add.Tensor"(%ad) args [0 : index, 1.0e-05, 1] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %r = fsdp.aten "aten::rsqrt"(%n) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  return %g, %g2, %r : tensor<8x64xbf16>, tensor<8x64xbf16>, tensor<8x64xbf16>
}
}
// CHECK:      {"format": "fsdpc.program", "version": 7, "device": "cuda",
// CHECK:       "kernels": [
// CHECK-NEXT:    {"inputs":2,"name":"fsdp_pointwise_0","outputs":1,"source":"inline float fsdp_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\ntemplate <typename T> void fsdp_pointwise_0(T in0, T in1, T& out0) {\n  const float a0 = static_cast<float>(in0);\n  const float a1 = static_cast<float>(in1);\n  const float v0 = (a0 * fsdp_sigmoid(a0));\n  const float v1 = (v0 * a1);\n  out0 = static_cast<T>(v1);\n}\n"},
// CHECK-NEXT:    {"inputs":1,"name":"fsdp_pointwise_1","outputs":1,"source":"template <typename T> void fsdp_pointwise_1(T in0, T& out0) {\n  const float a0 = static_cast<float>(in0);\n  const float v0 = (a0 + 1e-05f);\n  const float v1 = rsqrtf(v0);\n  out0 = static_cast<T>(v1);\n}\n"}
// CHECK-NEXT:  ],
// CHECK:         {"args":[{"tensor":1},{"string":"contiguous_format"}],{{.*}}"results":[3]},
// CHECK-NEXT:    {"op":"release","values":[1]},
// CHECK-NEXT:    {"inputs":[2,3],"kernel":0,{{.*}}"op":"pointwise","results":[4]},
// CHECK-NEXT:    {"inputs":[3,2],"kernel":0,{{.*}}"op":"pointwise","results":[5]},
// CHECK-NEXT:    {"op":"release","values":[3]},
// CHECK-NEXT:    {"inputs":[2],"kernel":1,{{.*}}"op":"pointwise","results":[6]},
// CHECK-NEXT:    {"op":"release","values":[2]},
// CHECK-NEXT:    {"op":"return","values":[4,5,6]}
