// The step of mlp_step.mlir after FULL_SHARD over 4 ranks with bf16 compute
// (param_dtype = bf16, reduce_dtype = f32), written out by hand to show the
// dialect's communication vocabulary until the sharding passes produce it:
//
// * every parameter is split along dim 0 with padding: fc2 has 10 rows, so
//   each rank stores ceil(10/4) = 3 rows and the group pads 2;
// * each wrap unit gathers its parameters in one bucket; the cast to bf16 is
//   fused into the all-gather copy-in;
// * the root's gather is prefetched one unit early, so it overlaps fc1;
// * fc1 is resharded right after forward (its backward needs no weights),
//   the root keeps its parameters for backward (FSDP2's root default);
// * gradients are reduce-scattered per unit, widened to f32 as they are packed.

shard.grid @dp(shape = 4)

fsdp.unit @root root class "Sequential"
fsdp.unit @fc1 class "Linear"

fsdp.param @"fc1.weight" : tensor<32x16xf32> unit @fc1 sharded on @dp axes = [0] padding = 0
fsdp.param @"fc1.bias" : tensor<32xf32> unit @fc1 sharded on @dp axes = [0] padding = 0
fsdp.param @"fc2.weight" : tensor<10x32xf32> unit @root sharded on @dp axes = [0] padding = 2
fsdp.param @"fc2.bias" : tensor<10xf32> unit @root sharded on @dp axes = [0] padding = 2

func.func @train_step(%x: tensor<8x16xf32>, %target: tensor<8x10xf32>) -> tensor<f32> {
  // Forward: gather fc1, prefetch the root, compute fc1, free fc1.
  %w1s = fsdp.get_param @"fc1.weight" : tensor<8x16xf32>
  %b1s = fsdp.get_param @"fc1.bias" : tensor<8xf32>
  %fc1_gather = fsdp.all_gather_start %w1s, %b1s on @dp axes = [0] unit @fc1
      : tensor<8x16xf32>, tensor<8xf32> -> !fsdp.future<tensor<32x16xbf16>, tensor<32xbf16>>
  %w2s = fsdp.get_param @"fc2.weight" : tensor<3x32xf32>
  %b2s = fsdp.get_param @"fc2.bias" : tensor<3xf32>
  %root_gather = fsdp.all_gather_start %w2s, %b2s on @dp axes = [0] unit @root prefetch 1
      : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  %w1, %b1 = fsdp.wait %fc1_gather : !fsdp.future<tensor<32x16xbf16>, tensor<32xbf16>>
  %xb = fsdp.cast %x : tensor<8x16xf32> to tensor<8x16xbf16>
  %w1t = fsdp.aten "aten::t" (%w1) : (tensor<32x16xbf16>) -> tensor<16x32xbf16>
  %h = fsdp.aten "aten::addmm" (%b1, %xb, %w1t) : (tensor<32xbf16>, tensor<8x16xbf16>, tensor<16x32xbf16>) -> tensor<8x32xbf16>
  fsdp.reshard %w1, %b1 : tensor<32x16xbf16>, tensor<32xbf16>
  %a = fsdp.aten "aten::relu" (%h) : (tensor<8x32xbf16>) -> tensor<8x32xbf16>
  %w2, %b2 = fsdp.wait %root_gather : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  %w2t = fsdp.aten "aten::t" (%w2) : (tensor<10x32xbf16>) -> tensor<32x10xbf16>
  %y = fsdp.aten "aten::addmm" (%b2, %a, %w2t) : (tensor<10xbf16>, tensor<8x32xbf16>, tensor<32x10xbf16>) -> tensor<8x10xbf16>
  %yf = fsdp.cast %y : tensor<8x10xbf16> to tensor<8x10xf32>
  %loss = fsdp.aten "aten::mse_loss" (%yf, %target) args [0 : index, 1 : index, 1] : (tensor<8x10xf32>, tensor<8x10xf32>) -> tensor<f32>
  fsdp.loss %loss : tensor<f32>

  // Backward: the root's parameters are still gathered.
  %seed = fsdp.aten "aten::ones_like" (%loss) : (tensor<f32>) -> tensor<f32>
  %gyf = fsdp.aten "aten::mse_loss_backward" (%seed, %yf, %target) args [0 : index, 1 : index, 2 : index, 1] : (tensor<f32>, tensor<8x10xf32>, tensor<8x10xf32>) -> tensor<8x10xf32>
  %gy = fsdp.cast %gyf : tensor<8x10xf32> to tensor<8x10xbf16>
  %gyt = fsdp.aten "aten::t" (%gy) : (tensor<8x10xbf16>) -> tensor<10x8xbf16>
  %gw2 = fsdp.aten "aten::mm" (%gyt, %a) : (tensor<10x8xbf16>, tensor<8x32xbf16>) -> tensor<10x32xbf16>
  %gb2 = fsdp.aten "aten::sum.dim_IntList" (%gy) args [0 : index, [0], false] : (tensor<8x10xbf16>) -> tensor<10xbf16>
  %ga = fsdp.aten "aten::mm" (%gy, %w2) : (tensor<8x10xbf16>, tensor<10x32xbf16>) -> tensor<8x32xbf16>
  fsdp.reshard %w2, %b2 : tensor<10x32xbf16>, tensor<10xbf16>
  %root_reduce = fsdp.reduce_scatter_start %gw2, %gb2 on @dp axes = [0] reduction = average reduce_dtype = f32 unit @root
      : tensor<10x32xbf16>, tensor<10xbf16> -> !fsdp.future<tensor<3x32xf32>, tensor<3xf32>>
  %gh = fsdp.aten "aten::threshold_backward" (%ga, %a) args [0 : index, 1 : index, 0.0] : (tensor<8x32xbf16>, tensor<8x32xbf16>) -> tensor<8x32xbf16>
  %ght = fsdp.aten "aten::t" (%gh) : (tensor<8x32xbf16>) -> tensor<32x8xbf16>
  %gw1 = fsdp.aten "aten::mm" (%ght, %xb) : (tensor<32x8xbf16>, tensor<8x16xbf16>) -> tensor<32x16xbf16>
  %gb1 = fsdp.aten "aten::sum.dim_IntList" (%gh) args [0 : index, [0], false] : (tensor<8x32xbf16>) -> tensor<32xbf16>
  %fc1_reduce = fsdp.reduce_scatter_start %gw1, %gb1 on @dp axes = [0] reduction = average reduce_dtype = f32 unit @fc1
      : tensor<32x16xbf16>, tensor<32xbf16> -> !fsdp.future<tensor<8x16xf32>, tensor<8xf32>>
  %gw2s, %gb2s = fsdp.wait %root_reduce : !fsdp.future<tensor<3x32xf32>, tensor<3xf32>>
  %gw1s, %gb1s = fsdp.wait %fc1_reduce : !fsdp.future<tensor<8x16xf32>, tensor<8xf32>>
  fsdp.gradients [@"fc1.weight", @"fc1.bias", @"fc2.weight", @"fc2.bias"] %gw1s, %gb1s, %gw2s, %gb2s
      : tensor<8x16xf32>, tensor<8xf32>, tensor<3x32xf32>, tensor<3xf32>
  return %loss : tensor<f32>
}
