// RUN: fsdp-opt %s --fsdp-fold-views | FileCheck %s
// RUN: fsdp-opt %s --fsdp-sharding-pipeline="ranks=2" | FileCheck %s --check-prefix=PIPELINE

fsdp.unit @root root class "Net"
fsdp.param @w : tensor<4x8xf32> unit @root
func.func @train_step(%x: tensor<8x8xf32>, %y: tensor<2x3x4xf32>) -> tensor<f32> {
  %w = fsdp.get_param @w : tensor<4x8xf32>
  // A transpose of a transpose is the weight itself.
  %t = fsdp.aten "aten::permute"(%w) args [0 : index, [1, 0]] module "" : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %u = fsdp.aten "aten::permute"(%t) args [0 : index, [1, 0]] module "" : (tensor<8x4xf32>) -> tensor<4x8xf32>
  %m = fsdp.aten "aten::mm"(%u, %x) module "" : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  // A reshape of a reshape of a reshape is one reshape of the base.
  %v1 = fsdp.aten "aten::view"(%x) args [0 : index, [2, 4, 8]] module "" : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %v2 = fsdp.aten "aten::_unsafe_view"(%v1) args [0 : index, [2, 32]] module "" : (tensor<2x4x8xf32>) -> tensor<2x32xf32>
  %v3 = fsdp.aten "aten::view"(%v2) args [0 : index, [64]] module "" : (tensor<2x32xf32>) -> tensor<64xf32>
  // Two permutes compose: [2, 0, 1] then [1, 2, 0] of that is the identity
  // on the base; [0, 2, 1] then [2, 0, 1] of that is [1, 0, 2].
  %p1 = fsdp.aten "aten::permute"(%y) args [0 : index, [2, 0, 1]] module "" : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
  %p2 = fsdp.aten "aten::permute"(%p1) args [0 : index, [1, 2, 0]] module "" : (tensor<4x2x3xf32>) -> tensor<2x3x4xf32>
  %q1 = fsdp.aten "aten::permute"(%y) args [0 : index, [0, -1, 1]] module "" : (tensor<2x3x4xf32>) -> tensor<2x4x3xf32>
  %q2 = fsdp.aten "aten::permute"(%q1) args [0 : index, [2, 0, 1]] module "" : (tensor<2x4x3xf32>) -> tensor<3x2x4xf32>
  // An inner view read elsewhere stays; the outer one reads the base, here
  // in its own shape, so it is the base.
  %s = fsdp.aten "aten::view"(%x) args [0 : index, [64]] module "" : (tensor<8x8xf32>) -> tensor<64xf32>
  %s2 = fsdp.aten "aten::view"(%s) args [0 : index, [8, 8]] module "" : (tensor<64xf32>) -> tensor<8x8xf32>
  %sum = fsdp.aten "aten::sum"(%s) module "" : (tensor<64xf32>) -> tensor<f32>
  // Aliases and same-shape expands are their input.
  %a1 = fsdp.aten "aten::alias"(%m) module "" : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %a2 = fsdp.aten "aten::alias"(%a1) module "" : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %e = fsdp.aten "aten::expand"(%a2) args [0 : index, [4, 8], false] module "" : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // A broadcasting expand is a real view.
  %b = fsdp.aten "aten::expand"(%sum) args [0 : index, [4, 8], false] module "" : (tensor<f32>) -> tensor<4x8xf32>
  %all = fsdp.aten "aten::add.Tensor"(%e, %b) args [0 : index, 1 : index, 1] module "" : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %l = fsdp.aten "aten::sum"(%all) module "" : (tensor<4x8xf32>) -> tensor<f32>
  %l2 = fsdp.aten "aten::sum"(%v3) module "" : (tensor<64xf32>) -> tensor<f32>
  %l3 = fsdp.aten "aten::sum"(%p2) module "" : (tensor<2x3x4xf32>) -> tensor<f32>
  %l4 = fsdp.aten "aten::sum"(%q2) module "" : (tensor<3x2x4xf32>) -> tensor<f32>
  %l5 = fsdp.aten "aten::sum"(%s2) module "" : (tensor<8x8xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  return %l : tensor<f32>
}

// CHECK-LABEL: func.func @train_step
// CHECK-SAME:    (%[[X:.*]]: tensor<8x8xf32>, %[[Y:.*]]: tensor<2x3x4xf32>)
// CHECK:         %[[W:.*]] = fsdp.get_param @w
// CHECK-NEXT:    %[[M:.*]] = fsdp.aten "aten::mm"(%[[W]], %[[X]])
// CHECK-NEXT:    %[[V:.*]] = fsdp.aten "aten::view"(%[[X]]) args [0 : index, [64]] {{.*}} : (tensor<8x8xf32>) -> tensor<64xf32>
// CHECK-NEXT:    %[[Q:.*]] = fsdp.aten "aten::permute"(%[[Y]]) args [0 : index, [1, 0, 2]] {{.*}} -> tensor<3x2x4xf32>
// CHECK-NEXT:    %[[S:.*]] = fsdp.aten "aten::view"(%[[X]]) args [0 : index, [64]]
// CHECK-NEXT:    %[[SUM:.*]] = fsdp.aten "aten::sum"(%[[S]])
// CHECK-NEXT:    %[[B:.*]] = fsdp.aten "aten::expand"(%[[SUM]])
// CHECK-NEXT:    %[[ALL:.*]] = fsdp.aten "aten::add.Tensor"(%[[M]], %[[B]])
// CHECK-NEXT:    %[[L:.*]] = fsdp.aten "aten::sum"(%[[ALL]])
// CHECK-NEXT:    fsdp.aten "aten::sum"(%[[V]])
// CHECK-NEXT:    fsdp.aten "aten::sum"(%[[Y]])
// CHECK-NEXT:    fsdp.aten "aten::sum"(%[[Q]])
// CHECK-NEXT:    fsdp.aten "aten::sum"(%[[X]])
// CHECK-NEXT:    fsdp.loss %[[L]]

// The sharding pipeline folds before it shards: the gathered weight feeds
// the matmul directly.
// PIPELINE:     %[[G:.*]] = fsdp.wait
// PIPELINE-NOT: aten::permute"(%[[G]])
// PIPELINE:     fsdp.aten "aten::mm"(%[[G]],

// Size-1 dimensions added or dropped next to a reshape are part of it: a
// reshape of a squeeze reads the squeeze's input, and an unsqueeze of a
// reshape becomes one reshape of the reshape's input. A squeeze of an
// unsqueeze (no reshape) is left alone.
// CHECK-LABEL: func.func @unit_dimensions
// CHECK-SAME:    (%[[A:.*]]: tensor<4x1x8xf32>, %[[B:.*]]: tensor<32xf32>)
func.func @unit_dimensions(%a: tensor<4x1x8xf32>, %b: tensor<32xf32>) -> (tensor<4x2x4xf32>, tensor<4x1x8xf32>, tensor<4x8xf32>) {
  %s = fsdp.aten "aten::squeeze.dims"(%a) args [0 : index, [1]] : (tensor<4x1x8xf32>) -> tensor<4x8xf32>
  %r = fsdp.aten "aten::view"(%s) args [0 : index, [4, 2, 4]] : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %v = fsdp.aten "aten::view"(%b) args [0 : index, [4, 8]] : (tensor<32xf32>) -> tensor<4x8xf32>
  %u = fsdp.aten "aten::unsqueeze"(%v) args [0 : index, 1] : (tensor<4x8xf32>) -> tensor<4x1x8xf32>
  %w = fsdp.aten "aten::unsqueeze"(%s) args [0 : index, 1] : (tensor<4x8xf32>) -> tensor<4x1x8xf32>
  %z = fsdp.aten "aten::squeeze.dims"(%w) args [0 : index, [1]] : (tensor<4x1x8xf32>) -> tensor<4x8xf32>
  return %r, %u, %z : tensor<4x2x4xf32>, tensor<4x1x8xf32>, tensor<4x8xf32>
}
// CHECK:      %[[S:.*]] = fsdp.aten "aten::squeeze.dims"(%[[A]])
// CHECK-NEXT: %[[R:.*]] = fsdp.aten "aten::view"(%[[A]]) args [0 : index, [4, 2, 4]] : (tensor<4x1x8xf32>) -> tensor<4x2x4xf32>
// CHECK-NEXT: %[[U:.*]] = fsdp.aten "aten::view"(%[[B]]) args [0 : index, [4, 1, 8]] : (tensor<32xf32>) -> tensor<4x1x8xf32>
// CHECK-NEXT: %[[W:.*]] = fsdp.aten "aten::unsqueeze"(%[[S]])
// CHECK-NEXT: %[[Z:.*]] = fsdp.aten "aten::squeeze.dims"(%[[W]])
// CHECK-NEXT: return %[[R]], %[[U]], %[[Z]]
