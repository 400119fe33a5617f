// RUN: fsdp-opt %s -split-input-file --fsdp-selective-recompute | FileCheck %s
// RUN: fsdp-opt %s -split-input-file --fsdp-selective-recompute="ops=aten::relu" | FileCheck %s --check-prefix=ONLY-RELU

// gelu's result is read in backward through a view made in forward, and its
// input is read by gelu_backward anyway: backward recomputes gelu and the
// view right before the first reader, and forward's result dies there.
// CHECK-LABEL: func.func @gelu_through_a_view
// CHECK:       %[[Y:.*]] = fsdp.aten "aten::gelu"(%[[H:[^)]*]])
// CHECK-NEXT:  %[[V:.*]] = fsdp.aten "aten::view"(%[[Y]])
// CHECK-NEXT:  %[[O:.*]] = fsdp.aten "aten::mm"(%[[V]],
// CHECK:       fsdp.loss
// CHECK-NEXT:  %[[Y2:.*]] = fsdp.aten "aten::gelu"(%[[H]]) args [0 : index, "none"] {fsdp.recomputed}
// CHECK-NEXT:  %[[V2:.*]] = fsdp.aten "aten::view"(%[[Y2]]) args [0 : index, [4, 8]] {fsdp.recomputed}
// CHECK-NEXT:  %[[T:.*]] = fsdp.aten "aten::t"(%[[V2]])
// CHECK-NEXT:  fsdp.aten "aten::mm"(%[[T]],
// CHECK-NEXT:  fsdp.aten "aten::gelu_backward"(%{{.*}}, %[[H]])
// ONLY-RELU-LABEL: func.func @gelu_through_a_view
// ONLY-RELU:       fsdp.loss
// ONLY-RELU-NOT:   "aten::gelu"(
func.func @gelu_through_a_view(%h: tensor<4x8xf32>, %w: tensor<8x2xf32>, %g: tensor<4x2xf32>) {
  %y = fsdp.aten "aten::gelu" (%h) args [0 : index, "none"] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %v = fsdp.aten "aten::view" (%y) args [0 : index, [4, 8]] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %o = fsdp.aten "aten::mm" (%v, %w) : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  %l = fsdp.aten "aten::sum" (%o) : (tensor<4x2xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %t = fsdp.aten "aten::t" (%v) : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %gw = fsdp.aten "aten::mm" (%t, %g) : (tensor<8x4xf32>, tensor<4x2xf32>) -> tensor<8x2xf32>
  %gh = fsdp.aten "aten::gelu_backward" (%g, %h) args [0 : index, 1 : index, "none"]
      : (tensor<4x2xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// relu's input is not read by backward (threshold_backward reads relu's
// output): recomputing would keep the input alive, so the output is saved.
// CHECK-LABEL: func.func @input_not_kept
// CHECK:       fsdp.loss
// CHECK-NOT:   "aten::relu"(
// ONLY-RELU-LABEL: func.func @input_not_kept
// ONLY-RELU:       fsdp.loss
// ONLY-RELU-NOT:   "aten::relu"(
func.func @input_not_kept(%x: tensor<4xf32>, %g: tensor<4xf32>) {
  %h = fsdp.aten "aten::mul" (%x, %x) args [0 : index, 1 : index] : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %r = fsdp.aten "aten::relu" (%h) : (tensor<4xf32>) -> tensor<4xf32>
  %l = fsdp.aten "aten::sum" (%r) : (tensor<4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %d = fsdp.aten "aten::threshold_backward" (%g, %r) args [0 : index, 1 : index, 0]
      : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

// A view made in backward follows the recomputed value.
// CHECK-LABEL: func.func @backward_view
// CHECK:       fsdp.loss
// CHECK-NEXT:  %[[R2:.*]] = fsdp.aten "aten::relu"(%[[X:[^)]*]])
// CHECK-NEXT:  fsdp.aten "aten::t"(%[[R2]])
// ONLY-RELU-LABEL: func.func @backward_view
// ONLY-RELU:       fsdp.loss
// ONLY-RELU-NEXT:  fsdp.aten "aten::relu"
func.func @backward_view(%x: tensor<4x4xf32>, %g: tensor<4x4xf32>) {
  %r = fsdp.aten "aten::relu" (%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %l = fsdp.aten "aten::sum" (%r) : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %t = fsdp.aten "aten::t" (%r) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %d = fsdp.aten "aten::threshold_backward" (%g, %x) args [0 : index, 1 : index, 0]
      : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %m = fsdp.aten "aten::mm" (%t, %d) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return
}

// -----

// SwiGLU: silu's result is read only by the mul after it and by that mul's
// backward, and the mul's result by w2's weight gradient, which backward
// runs first. The two recompute as one chain before that first reader, the
// mul reading silu's clone; forward keeps only the two matmul results.
// CHECK-LABEL: func.func @swiglu_chain
// CHECK:       fsdp.loss
// CHECK-NEXT:  %[[S2:.*]] = fsdp.aten "aten::silu"(%[[A:[^)]*]])
// CHECK-NEXT:  %[[M2:.*]] = fsdp.aten "aten::mul.Tensor"(%[[S2]], %[[B:[^)]*]])
// CHECK-NEXT:  %[[T:.*]] = fsdp.aten "aten::t"(%[[M2]])
// CHECK-NEXT:  fsdp.aten "aten::mm"(%[[T]],
// CHECK-NEXT:  fsdp.aten "aten::mm"
// CHECK-NEXT:  %[[DS:.*]] = fsdp.aten "aten::mul.Tensor"(%{{.*}}, %[[B]])
// CHECK-NEXT:  fsdp.aten "aten::mul.Tensor"(%{{.*}}, %[[S2]])
// CHECK-NEXT:  fsdp.aten "aten::silu_backward"(%[[DS]], %[[A]])
// ONLY-RELU-LABEL: func.func @swiglu_chain
// ONLY-RELU:       fsdp.loss
// ONLY-RELU-NEXT:  fsdp.aten "aten::t"
func.func @swiglu_chain(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %w2: tensor<8x2xf32>, %g: tensor<4x2xf32>) {
  %s = fsdp.aten "aten::silu" (%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %m = fsdp.aten "aten::mul.Tensor" (%s, %b) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %o = fsdp.aten "aten::mm" (%m, %w2) : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  %l = fsdp.aten "aten::sum" (%o) : (tensor<4x2xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %t = fsdp.aten "aten::t" (%m) : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %gw2 = fsdp.aten "aten::mm" (%t, %g) : (tensor<8x4xf32>, tensor<4x2xf32>) -> tensor<8x2xf32>
  %gm = fsdp.aten "aten::mm" (%g, %w2) : (tensor<4x2xf32>, tensor<8x2xf32>) -> tensor<4x8xf32>
  %gs = fsdp.aten "aten::mul.Tensor" (%gm, %b) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %gb = fsdp.aten "aten::mul.Tensor" (%gm, %s) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %ga = fsdp.aten "aten::silu_backward" (%gs, %a) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// A CUDA step's fused RMSNorm: its input and weight are read by its
// backward anyway, so backward recomputes output and rstd (one kernel)
// instead of keeping the output for the next layer's weight gradient.
// CHECK-LABEL: func.func @fused_rms_norm
// CHECK:       fsdp.loss
// CHECK-NEXT:  %[[N:.*]]:2 = fsdp.aten "aten::_fused_rms_norm"(%arg0, %arg1) {{.*}} {fsdp.recomputed}
// CHECK-NEXT:  %[[T:.*]] = fsdp.aten "aten::t"(%[[N]]#0)
// CHECK:       fsdp.aten "aten::_fused_rms_norm_backward"(%{{.*}}, %arg0, %[[N]]#1, %arg1)
// ONLY-RELU-LABEL: func.func @fused_rms_norm
// ONLY-RELU:       fsdp.loss
// ONLY-RELU-NOT:   "aten::_fused_rms_norm"(
func.func @fused_rms_norm(%x: tensor<4x8xbf16>, %w: tensor<8xbf16>, %m: tensor<8x2xbf16>, %g: tensor<4x2xbf16>) {
  %n:2 = fsdp.aten "aten::_fused_rms_norm" (%x, %w) args [0 : index, [8], 1 : index, 1.0e-05]
      : (tensor<4x8xbf16>, tensor<8xbf16>) -> (tensor<4x8xbf16>, tensor<4x1xf32>)
  %o = fsdp.aten "aten::mm" (%n#0, %m) : (tensor<4x8xbf16>, tensor<8x2xbf16>) -> tensor<4x2xbf16>
  %l = fsdp.aten "aten::sum" (%o) : (tensor<4x2xbf16>) -> tensor<bf16>
  fsdp.loss %l : tensor<bf16>
  %t = fsdp.aten "aten::t" (%n#0) : (tensor<4x8xbf16>) -> tensor<8x4xbf16>
  %gm = fsdp.aten "aten::mm" (%t, %g) : (tensor<8x4xbf16>, tensor<4x2xbf16>) -> tensor<8x2xbf16>
  %mt = fsdp.aten "aten::t" (%m) : (tensor<8x2xbf16>) -> tensor<2x8xbf16>
  %gn = fsdp.aten "aten::mm" (%g, %mt) : (tensor<4x2xbf16>, tensor<2x8xbf16>) -> tensor<4x8xbf16>
  %gx:2 = fsdp.aten "aten::_fused_rms_norm_backward" (%gn, %x, %n#1, %w) args [0 : index, 1 : index, [8], 2 : index, 3 : index, [true, true]]
      : (tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<4x1xf32>, tensor<8xbf16>) -> (tensor<4x8xbf16>, tensor<8xbf16>)
  return
}
