// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward --fsdp-bucket-collectives | FileCheck %s
// RUN: fsdp-opt %s --fsdp-bucket-collectives | FileCheck %s --check-prefix=ADJACENT

// One all-gather for l0's weight and bias, where the first one was; one
// reduce-scatter for their gradients, where the last one was.
// CHECK:      %[[W:.*]] = fsdp.get_param @l0.w : tensor<3x4xf32>
// CHECK-NEXT: %[[B:.*]] = fsdp.get_param @l0.b : tensor<3xf32>
// CHECK-NEXT: %[[F:.*]] = fsdp.all_gather_start %[[W]], %[[B]] on @fsdp_grid axes = [0] unit @l0 : tensor<3x4xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x4xf32>, tensor<10xf32>>
// CHECK-NEXT: %{{.*}}:2 = fsdp.wait %[[F]] : !fsdp.future<tensor<10x4xf32>, tensor<10xf32>>
// CHECK:      %[[GW:.*]] = fsdp.aten "aten::mm"(%{{.*}}, %arg0) module "l0"
// CHECK-NEXT: %[[GB:.*]] = fsdp.aten "aten::sum.dim_IntList"
// CHECK-NEXT: %[[R:.*]] = fsdp.reduce_scatter_start %[[GW]], %[[GB]] on @fsdp_grid axes = [0] reduction = average reduce_dtype = f32 unit @l0 : tensor<10x4xf32>, tensor<10xf32> -> !fsdp.future<tensor<3x4xf32>, tensor<3xf32>>
// CHECK-NEXT: %[[G:.*]]:2 = fsdp.wait %[[R]]
// CHECK-NEXT: fsdp.gradients [@l0.w, @l0.b, @l1.w] %[[G]]#0, %[[G]]#1, %{{.*}}

// Only adjacent collectives of one unit merge: a, b, a stays three buckets
// (every rank issues the same sequence), while the two b's do merge.
// ADJACENT-LABEL: func.func @interleaved
// ADJACENT:       fsdp.all_gather_start %{{.*}} unit @a : tensor<1xf32>
// ADJACENT:       fsdp.all_gather_start %{{.*}}, %{{.*}} unit @b : tensor<1xf32>, tensor<1xf32>
// ADJACENT:       fsdp.all_gather_start %{{.*}} unit @a : tensor<1xf32>
// ADJACENT-NOT:   fsdp.all_gather_start
shard.grid @fsdp_grid(shape = 2)
fsdp.unit @root root
fsdp.unit @a
fsdp.unit @b
fsdp.param @a1 : tensor<2xf32> unit @a sharded on @fsdp_grid axes = [0] padding = 0
fsdp.param @b1 : tensor<2xf32> unit @b sharded on @fsdp_grid axes = [0] padding = 0
fsdp.param @b2 : tensor<2xf32> unit @b sharded on @fsdp_grid axes = [0] padding = 0
fsdp.param @a2 : tensor<2xf32> unit @a sharded on @fsdp_grid axes = [0] padding = 0
func.func @interleaved(%l: tensor<f32>) -> tensor<2xf32> {
  %s1 = fsdp.get_param @a1 : tensor<1xf32>
  %f1 = fsdp.all_gather_start %s1 on @fsdp_grid axes = [0] unit @a : tensor<1xf32> -> !fsdp.future<tensor<2xf32>>
  %w1 = fsdp.wait %f1 : !fsdp.future<tensor<2xf32>>
  %s2 = fsdp.get_param @b1 : tensor<1xf32>
  %f2 = fsdp.all_gather_start %s2 on @fsdp_grid axes = [0] unit @b : tensor<1xf32> -> !fsdp.future<tensor<2xf32>>
  %w2 = fsdp.wait %f2 : !fsdp.future<tensor<2xf32>>
  %x = fsdp.aten "aten::add.Tensor" (%w1, %w2) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  %s3 = fsdp.get_param @b2 : tensor<1xf32>
  %f3 = fsdp.all_gather_start %s3 on @fsdp_grid axes = [0] unit @b : tensor<1xf32> -> !fsdp.future<tensor<2xf32>>
  %w3 = fsdp.wait %f3 : !fsdp.future<tensor<2xf32>>
  %s4 = fsdp.get_param @a2 : tensor<1xf32>
  %f4 = fsdp.all_gather_start %s4 on @fsdp_grid axes = [0] unit @a : tensor<1xf32> -> !fsdp.future<tensor<2xf32>>
  %w4 = fsdp.wait %f4 : !fsdp.future<tensor<2xf32>>
  %y = fsdp.aten "aten::add.Tensor" (%x, %w3) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  %z = fsdp.aten "aten::add.Tensor" (%y, %w4) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  fsdp.reshard %w1, %w2, %w3, %w4 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  fsdp.loss %l : tensor<f32>
  return %z : tensor<2xf32>
}
