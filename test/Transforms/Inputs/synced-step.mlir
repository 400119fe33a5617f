// A captured step that sums activations over the data-parallel ranks, as
// SyncBatchNorm does: a statistic in forward, its gradient in backward.
fsdp.unit @root root class "Net"
fsdp.param @"w" : tensor<6x4xf32> unit @root
func.func @train_step(%x: tensor<2x4xf32>) -> tensor<f32> {
  %w = fsdp.get_param @"w" : tensor<6x4xf32>
  %wt = fsdp.aten "aten::t" (%w) module "" : (tensor<6x4xf32>) -> tensor<4x6xf32>
  %y = fsdp.aten "aten::mm" (%x, %wt) module "" : (tensor<2x4xf32>, tensor<4x6xf32>) -> tensor<2x6xf32>
  %s = fsdp.aten "aten::sum.dim_IntList" (%y) args [0 : index, [0], false, unit] module "bn" : (tensor<2x6xf32>) -> tensor<6xf32>
  %total = fsdp.data_parallel_sum %s : tensor<6xf32>
  %l = fsdp.aten "aten::sum" (%total) module "" : (tensor<6xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %gs = fsdp.aten "aten::ones" () args [[6], f32] module "" : () -> tensor<6xf32>
  %gtotal = fsdp.data_parallel_sum %gs : tensor<6xf32>
  %gy = fsdp.aten "aten::expand" (%gtotal) args [0 : index, [2, 6], false] module "bn" : (tensor<6xf32>) -> tensor<2x6xf32>
  %gyt = fsdp.aten "aten::t" (%gy) module "" : (tensor<2x6xf32>) -> tensor<6x2xf32>
  %gw = fsdp.aten "aten::mm" (%gyt, %x) module "" : (tensor<6x2xf32>, tensor<2x4xf32>) -> tensor<6x4xf32>
  fsdp.gradients [@"w"] %gw : tensor<6x4xf32>
  return %l : tensor<f32>
}
