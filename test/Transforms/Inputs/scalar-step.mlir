// A captured step with a scalar parameter (a temperature, like CLIP's
// logit_scale) next to a matrix, both in the root unit.
fsdp.unit @root root class "Net"
fsdp.param @"w" : tensor<6x4xf32> unit @root
fsdp.param @"temp" : tensor<f32> unit @root
func.func @train_step(%x: tensor<2x4xf32>) -> tensor<f32> {
  %w = fsdp.get_param @"w" : tensor<6x4xf32>
  %t = fsdp.get_param @"temp" : tensor<f32>
  %wt = fsdp.aten "aten::t" (%w) module "" : (tensor<6x4xf32>) -> tensor<4x6xf32>
  %y = fsdp.aten "aten::mm" (%x, %wt) module "" : (tensor<2x4xf32>, tensor<4x6xf32>) -> tensor<2x6xf32>
  %z = fsdp.aten "aten::mul.Tensor" (%y, %t) module "" : (tensor<2x6xf32>, tensor<f32>) -> tensor<2x6xf32>
  %l = fsdp.aten "aten::sum" (%z) module "" : (tensor<2x6xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %gz = fsdp.aten "aten::ones" () args [[2, 6], f32] module "" : () -> tensor<2x6xf32>
  %gy = fsdp.aten "aten::mul.Tensor" (%gz, %t) module "" : (tensor<2x6xf32>, tensor<f32>) -> tensor<2x6xf32>
  %gt = fsdp.aten "aten::sum" (%y) module "" : (tensor<2x6xf32>) -> tensor<f32>
  %gyt = fsdp.aten "aten::t" (%gy) module "" : (tensor<2x6xf32>) -> tensor<6x2xf32>
  %gw = fsdp.aten "aten::mm" (%gyt, %x) module "" : (tensor<6x2xf32>, tensor<2x4xf32>) -> tensor<6x4xf32>
  fsdp.gradients [@"w", @"temp"] %gw, %gt : tensor<6x4xf32>, tensor<f32>
  return %l : tensor<f32>
}
