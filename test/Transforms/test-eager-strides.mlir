// RUN: fsdp-opt %s --fsdp-test-eager-strides | FileCheck %s

// A query as attention reads it: a matrix product's rows viewed as heads,
// permuted to [batch, heads, seq, dim], sliced in halves along dim. An
// elementwise call follows its first input's order (the table, broadcast,
// decides nothing); a concatenation is row-major; the batch is row-major
// (the runtime hands it over so).
// CHECK-LABEL: func.func @rotary_layouts
func.func @rotary_layouts(%x: tensor<16x8xf32>, %cos: tensor<4x8xf32>) -> (tensor<2x2x4x8xf32>, tensor<2x2x4x8xf32>, tensor<2x2x4x8xf32>) {
  // CHECK: fsdp.aten "aten::clone"{{.*}}test.eager_strides = [array<i64: 8, 1>]
  %xd = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<16x8xf32>) -> tensor<16x8xf32>
  // CHECK: fsdp.aten "aten::clone"{{.*}}test.eager_strides = [array<i64: 8, 1>]
  %cd = fsdp.aten "aten::clone"(%cos) args [0 : index, "contiguous_format"] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: fsdp.aten "aten::view"{{.*}}test.eager_strides = [array<i64: 64, 16, 8, 1>]
  %v = fsdp.aten "aten::view"(%xd) args [0 : index, [2, 4, 2, 8]] : (tensor<16x8xf32>) -> tensor<2x4x2x8xf32>
  // CHECK: fsdp.aten "aten::permute"{{.*}}test.eager_strides = [array<i64: 64, 8, 16, 1>]
  %q = fsdp.aten "aten::permute"(%v) args [0 : index, [0, 2, 1, 3]] : (tensor<2x4x2x8xf32>) -> tensor<2x2x4x8xf32>
  // CHECK: fsdp.aten "aten::mul.Tensor"{{.*}}test.eager_strides = [array<i64: 64, 8, 16, 1>]
  %qc = fsdp.aten "aten::mul.Tensor"(%q, %cd) : (tensor<2x2x4x8xf32>, tensor<4x8xf32>) -> tensor<2x2x4x8xf32>
  // CHECK: fsdp.aten "aten::mul.Tensor"{{.*}}test.eager_strides = [array<i64: 64, 8, 16, 1>]
  %cq = fsdp.aten "aten::mul.Tensor"(%cd, %q) : (tensor<4x8xf32>, tensor<2x2x4x8xf32>) -> tensor<2x2x4x8xf32>
  // CHECK: fsdp.aten "aten::slice.Tensor"{{.*}}test.eager_strides = [array<i64: 64, 8, 16, 1>]
  %hi = fsdp.aten "aten::slice.Tensor"(%q) args [0 : index, 3, 4, 8, 1] : (tensor<2x2x4x8xf32>) -> tensor<2x2x4x4xf32>
  // CHECK: fsdp.aten "aten::neg"{{.*}}test.eager_strides = [array<i64: 32, 4, 8, 1>]
  %n = fsdp.aten "aten::neg"(%hi) : (tensor<2x2x4x4xf32>) -> tensor<2x2x4x4xf32>
  // CHECK: fsdp.aten "aten::cat"{{.*}}test.eager_strides = [array<i64: 64, 32, 8, 1>]
  %r = fsdp.aten "aten::cat"(%n, %n) args [[0 : index, 1 : index], -1] : (tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>) -> tensor<2x2x4x8xf32>
  // The first input decides: the row-major concatenation, then the query.
  // CHECK: fsdp.aten "aten::add.Tensor"{{.*}}test.eager_strides = [array<i64: 64, 32, 8, 1>]
  %s = fsdp.aten "aten::add.Tensor"(%r, %qc) args [0 : index, 1 : index, 1] : (tensor<2x2x4x8xf32>, tensor<2x2x4x8xf32>) -> tensor<2x2x4x8xf32>
  // CHECK: fsdp.aten "aten::view"{{.*}}test.eager_strides = [array<i64: 1>]
  %flat = fsdp.aten "aten::view"(%x) args [0 : index, [128]] : (tensor<16x8xf32>) -> tensor<128xf32>
  return %qc, %cq, %s : tensor<2x2x4x8xf32>, tensor<2x2x4x8xf32>, tensor<2x2x4x8xf32>
}

// The fused RMSNorm (a CUDA step's nn.RMSNorm) allocates its output, its
// statistics and its gradients row-major, whatever the input's layout.
// CHECK-LABEL: func.func @fused_rms_norm_layouts
func.func @fused_rms_norm_layouts(%x: tensor<8x4x16xbf16>, %w: tensor<16xbf16>) -> (tensor<4x8x16xbf16>, tensor<16xbf16>) {
  // CHECK: fsdp.aten "aten::clone"{{.*}}test.eager_strides = [array<i64: 64, 16, 1>]
  %xd = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<8x4x16xbf16>) -> tensor<8x4x16xbf16>
  // CHECK: fsdp.aten "aten::permute"{{.*}}test.eager_strides = [array<i64: 16, 64, 1>]
  %t = fsdp.aten "aten::permute"(%xd) args [0 : index, [1, 0, 2]] : (tensor<8x4x16xbf16>) -> tensor<4x8x16xbf16>
  // CHECK: fsdp.aten "aten::_fused_rms_norm"{{.*}}test.eager_strides = [array<i64: 128, 16, 1>, array<i64: 8, 1, 1>]
  %y:2 = fsdp.aten "aten::_fused_rms_norm"(%t, %w) args [0 : index, [16], 1 : index, 1.0e-05] : (tensor<4x8x16xbf16>, tensor<16xbf16>) -> (tensor<4x8x16xbf16>, tensor<4x8x1xf32>)
  // CHECK: fsdp.aten "aten::_fused_rms_norm_backward"{{.*}}test.eager_strides = [array<i64: 128, 16, 1>, array<i64: 1>]
  %g:2 = fsdp.aten "aten::_fused_rms_norm_backward"(%y#0, %t, %y#1, %w) args [0 : index, 1 : index, [16], 2 : index, 3 : index, [true, true]] : (tensor<4x8x16xbf16>, tensor<4x8x16xbf16>, tensor<4x8x1xf32>, tensor<16xbf16>) -> (tensor<4x8x16xbf16>, tensor<16xbf16>)
  return %g#0, %g#1 : tensor<4x8x16xbf16>, tensor<16xbf16>
}
