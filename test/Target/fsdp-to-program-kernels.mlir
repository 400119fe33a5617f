// RUN: fsdp-opt %s --fsdp-fuse-pointwise --fsdp-plan-lifetimes | fsdp-translate --fsdp-to-program | FileCheck %s

// Fused chains lower to `kernels`, each once (the two identical SwiGLU
// chains share fsdp_pointwise_0), and `pointwise` instructions that name
// their kernel, inputs and results. A kernel is its element function in
// float (the helpers it calls first) and its loop's layout: contiguous
// tensors make one dimension of 16-byte vectors (8 bf16); a row broadcast
// along the inner dimension has step 0 there; a transposed input orders
// the loop (the output follows it, as TensorIterator's would) and the
// other input is read with a step of 64 there.
module attributes {fsdp.device = "cuda"} {
func.func @two_swiglus(%a: tensor<8x64xbf16>, %b: tensor<8x64xbf16>, %c: tensor<8x64xbf16>, %d: tensor<8x64xbf16>, %e: tensor<8x64xbf16>) -> (tensor<8x64xbf16>, tensor<8x64xbf16>, tensor<8x64xbf16>) {
  %ad = fsdp.aten "aten::clone"(%a) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %bd = fsdp.aten "aten::clone"(%b) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %cd = fsdp.aten "aten::clone"(%c) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %dd = fsdp.aten "aten::clone"(%d) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %ed = fsdp.aten "aten::clone"(%e) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %s = fsdp.aten "aten::silu"(%ad) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %g = fsdp.aten "aten::mul.Tensor"(%s, %bd) : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %s2 = fsdp.aten "aten::silu"(%cd) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %g2 = fsdp.aten "aten::mul.Tensor"(%s2, %dd) : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %n = fsdp.aten "aten::add.Tensor"(%ed) args [0 : index, 1.0e-05, 1] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %r = fsdp.aten "aten::rsqrt"(%n) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  return %g, %g2, %r : tensor<8x64xbf16>, tensor<8x64xbf16>, tensor<8x64xbf16>
}
func.func @layouts(%a: tensor<8x64xbf16>, %b: tensor<8x1xbf16>, %c: tensor<64x8xbf16>) -> (tensor<8x64xbf16>, tensor<8x64xbf16>) {
  %ad = fsdp.aten "aten::clone"(%a) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %bd = fsdp.aten "aten::clone"(%b) args [0 : index, "contiguous_format"] : (tensor<8x1xbf16>) -> tensor<8x1xbf16>
  %cd = fsdp.aten "aten::clone"(%c) args [0 : index, "contiguous_format"] : (tensor<64x8xbf16>) -> tensor<64x8xbf16>
  %m = fsdp.aten "aten::mul.Tensor"(%ad, %bd) : (tensor<8x64xbf16>, tensor<8x1xbf16>) -> tensor<8x64xbf16>
  %e = fsdp.aten "aten::exp"(%m) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %t = fsdp.aten "aten::t"(%cd) : (tensor<64x8xbf16>) -> tensor<8x64xbf16>
  %p = fsdp.aten "aten::mul.Tensor"(%t, %ad) : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %q = fsdp.aten "aten::neg"(%p) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  return %e, %q : tensor<8x64xbf16>, tensor<8x64xbf16>
}
}
// CHECK:      {"format": "fsdpc.program", "version": 10, "device": "cuda",
// CHECK:       "kernels": [
// CHECK-NEXT:  {"block":256,"element_type":"bf16","extents":[512],"grid":1,"inputs":[{"shape":[8,64],"steps":[1],"strides":[64,1]},{"shape":[8,64],"steps":[1],"strides":[64,1]}],"name":"fsdp_pointwise_0","outputs":[{"shape":[8,64],"steps":[1],"strides":[64,1]}],"source":"__device__ inline float fsdp_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\n__device__ __forceinline__ void fsdp_pointwise_0(float in0, float in1, float& out0) {\n  const float a0 = in0;\n  const float a1 = in1;\n  const float v0 = (a0 * fsdp_sigmoid(a0));\n  const float v1 = (v0 * a1);\n  out0 = v1;\n}\n","vector":8},
// CHECK-NEXT:  {"block":256,"element_type":"bf16","extents":[512],"grid":1,"inputs":[{"shape":[8,64],"steps":[1],"strides":[64,1]}],"name":"fsdp_pointwise_1","outputs":[{"shape":[8,64],"steps":[1],"strides":[64,1]}],"source":"__device__ __forceinline__ void fsdp_pointwise_1(float in0, float& out0) {\n  const float a0 = in0;\n  const float v0 = (a0 + 1e-05f);\n  const float v1 = rsqrtf(v0);\n  out0 = v1;\n}\n","vector":8},
// CHECK-NEXT:  {"block":256,"element_type":"bf16","extents":[64,8],"grid":1,"inputs":[{"shape":[8,64],"steps":[1,64],"strides":[64,1]},{"shape":[8,1],"steps":[0,1],"strides":[1,1]}],"name":"fsdp_pointwise_2","outputs":[{"shape":[8,64],"steps":[1,64],"strides":[64,1]}],"source":"__device__ __forceinline__ void fsdp_pointwise_2(float in0, float in1, float& out0) {\n  const float a0 = in0;\n  const float a1 = in1;\n  const float v0 = (a0 * a1);\n  const float v1 = expf(v0);\n  out0 = v1;\n}\n","vector":8},
// CHECK-NEXT:  {"block":256,"element_type":"bf16","extents":[8,64],"grid":1,"inputs":[{"shape":[8,64],"steps":[1,8],"strides":[1,8]},{"shape":[8,64],"steps":[64,1],"strides":[64,1]}],"name":"fsdp_pointwise_3","outputs":[{"shape":[8,64],"steps":[1,8],"strides":[1,8]}],"source":"__device__ __forceinline__ void fsdp_pointwise_3(float in0, float in1, float& out0) {\n  const float a0 = in0;\n  const float a1 = in1;\n  const float v0 = (a0 * a1);\n  const float v1 = (-v0);\n  out0 = v1;\n}\n","vector":8}
// CHECK-NEXT:  ],
// CHECK:         {"args":[{"tensor":4},{"string":"contiguous_format"}],{{.*}}"results":[9]},
// CHECK-NEXT:    {"op":"release","values":[4]},
// CHECK-NEXT:    {"inputs":[5,6],"kernel":0,{{.*}}"op":"pointwise","results":[10]},
// CHECK-NEXT:    {"op":"release","values":[5,6]},
// CHECK-NEXT:    {"inputs":[7,8],"kernel":0,{{.*}}"op":"pointwise","results":[11]},
// CHECK-NEXT:    {"op":"release","values":[7,8]},
// CHECK-NEXT:    {"inputs":[9],"kernel":1,{{.*}}"op":"pointwise","results":[12]},
// CHECK-NEXT:    {"op":"release","values":[9]},
// CHECK-NEXT:    {"op":"return","values":[10,11,12]}
// CHECK:         {"inputs":[3,4],"kernel":2,{{.*}}"op":"pointwise","results":[6]},
// CHECK:         {"inputs":[7,3],"kernel":3,{{.*}}"op":"pointwise","results":[8]},
