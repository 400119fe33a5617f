// RUN: fsdp-opt %s -split-input-file --fsdp-plan-lifetimes | FileCheck %s
// RUN: fsdp-opt %s -split-input-file --fsdp-plan-lifetimes --fsdp-plan-lifetimes | FileCheck %s

// Each value is released right after its last use; an unused result right
// after its op; a returned value never. Values dying at one op share one
// release.
// CHECK-LABEL: func.func @chain(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x4xf32>, %[[W:[^:]*]]: tensor<4x4xf32>)
// CHECK-NEXT:    %[[H:.*]] = fsdp.aten "aten::mm"(%[[X]], %[[W]])
// CHECK-NEXT:    fsdp.release %[[X]], %[[W]] : tensor<8x4xf32>, tensor<4x4xf32>{{$}}
// CHECK-NEXT:    %[[M:.*]]:3 = fsdp.aten "aten::native_layer_norm"(%[[H]])
// CHECK-NEXT:    fsdp.release %[[M]]#1, %[[M]]#2 :
// CHECK-NEXT:    %[[Y:.*]] = fsdp.aten "aten::add.Tensor"(%[[M]]#0, %[[H]])
// CHECK-NEXT:    fsdp.release %[[H]], %[[M]]#0 : tensor<8x4xf32>, tensor<8x4xf32>{{$}}
// CHECK-NEXT:    return %[[Y]]
func.func @chain(%x: tensor<8x4xf32>, %w: tensor<4x4xf32>) -> tensor<8x4xf32> {
  %h = fsdp.aten "aten::mm" (%x, %w) : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %n:3 = fsdp.aten "aten::native_layer_norm" (%h) args [0 : index, [4], unit, unit, 1.0e-05]
      : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x1xf32>, tensor<8x1xf32>)
  %y = fsdp.aten "aten::add.Tensor" (%n#0, %h) args [0 : index, 1 : index, 1]
      : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  return %y : tensor<8x4xf32>
}

// -----

// Gathered buffers keep their reshard; a collective's inputs die right after
// its start (it copies them into its staging buffer); the loss and the
// gradients are released after their markers (the runtime keeps its own
// reference to what the step hands over).
shard.grid @dp(shape = 2)
fsdp.unit @root root
fsdp.param @w : tensor<4x4xf32> unit @root sharded on @dp axes = [0] padding = 0
// CHECK-LABEL: func.func @step(
// CHECK:         %[[S:.*]] = fsdp.get_param @w
// CHECK-NEXT:    %[[F:.*]] = fsdp.all_gather_start %[[S]]
// CHECK-NEXT:    fsdp.release %[[S]] : tensor<2x4xf32>{{$}}
// CHECK-NEXT:    %[[G:.*]] = fsdp.wait %[[F]]
// CHECK-NEXT:    %[[Y:.*]] = fsdp.aten "aten::mm"(%{{.*}}, %[[G]])
// CHECK-NEXT:    fsdp.reshard %[[G]]
// CHECK-NOT:     fsdp.release %[[G]]
// CHECK:         fsdp.loss %[[L:.*]] : tensor<f32>
// CHECK-NEXT:    fsdp.release %[[L]] : tensor<f32>{{$}}
// CHECK:         fsdp.reduce_scatter_start %[[GW:[^ ]*]]
// CHECK-NEXT:    fsdp.release %[[GW]] : tensor<4x4xf32>{{$}}
// CHECK:         fsdp.gradients [@w] %[[R:.*]] : tensor<2x4xf32>
// CHECK-NEXT:    fsdp.release %[[R]] : tensor<2x4xf32>{{$}}
// CHECK-NEXT:    return{{$}}
func.func @step(%x: tensor<4x4xf32>) {
  %s = fsdp.get_param @w : tensor<2x4xf32>
  %f = fsdp.all_gather_start %s on @dp axes = [0] : tensor<2x4xf32> -> !fsdp.future<tensor<4x4xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<4x4xf32>>
  %y = fsdp.aten "aten::mm" (%x, %g) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  fsdp.reshard %g : tensor<4x4xf32>
  %l = fsdp.aten "aten::sum" (%y) : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %gw = fsdp.aten "aten::mm" (%y, %x) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %r = fsdp.reduce_scatter_start %gw on @dp axes = [0] reduction = average reduce_dtype = f32
      : tensor<4x4xf32> -> !fsdp.future<tensor<2x4xf32>>
  %rg = fsdp.wait %r : !fsdp.future<tensor<2x4xf32>>
  fsdp.gradients [@w] %rg : tensor<2x4xf32>
  return
}
