// A small captured step shared by the pass tests: units l0 (weight + bias)
// and l1, and a frozen root parameter; l1's weight is read in backward
// through a view made in forward.
fsdp.unit @root root class "Net"
fsdp.unit @l0 class "Layer"
fsdp.unit @l1 class "Layer"
fsdp.param @"l0.w" : tensor<10x4xf32> unit @l0
fsdp.param @"l0.b" : tensor<10xf32> unit @l0
fsdp.param @"l1.w" : tensor<4x10xf32> unit @l1
fsdp.param @"head" : tensor<3x4xf32> unit @root frozen
func.func @train_step(%x: tensor<2x4xf32>) -> tensor<f32> {
  %w0 = fsdp.get_param @"l0.w" : tensor<10x4xf32>
  %b0 = fsdp.get_param @"l0.b" : tensor<10xf32>
  %h = fsdp.aten "aten::addmm" (%b0, %x, %w0) module "l0" : (tensor<10xf32>, tensor<2x4xf32>, tensor<10x4xf32>) -> tensor<2x10xf32>
  %a = fsdp.aten "aten::relu" (%h) module "l0" : (tensor<2x10xf32>) -> tensor<2x10xf32>
  %w1 = fsdp.get_param @"l1.w" : tensor<4x10xf32>
  %w1t = fsdp.aten "aten::t" (%w1) module "l1" : (tensor<4x10xf32>) -> tensor<10x4xf32>
  %y = fsdp.aten "aten::mm" (%a, %w1t) module "l1" : (tensor<2x10xf32>, tensor<10x4xf32>) -> tensor<2x4xf32>
  %hd = fsdp.get_param @"head" : tensor<3x4xf32>
  %z = fsdp.aten "aten::mm" (%y, %hd) module "" : (tensor<2x4xf32>, tensor<3x4xf32>) -> tensor<2x3xf32>
  %l = fsdp.aten "aten::sum" (%z) module "" : (tensor<2x3xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %gz = fsdp.aten "aten::ones" () args [[2, 3], f32] module "" : () -> tensor<2x3xf32>
  %gy = fsdp.aten "aten::mm" (%gz, %hd) module "" : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %ga = fsdp.aten "aten::mm" (%gy, %w1t) module "l1" : (tensor<2x4xf32>, tensor<10x4xf32>) -> tensor<2x10xf32>
  %gw1 = fsdp.aten "aten::mm" (%gy, %a) module "l1" : (tensor<2x4xf32>, tensor<2x10xf32>) -> tensor<4x10xf32>
  %gh = fsdp.aten "aten::threshold_backward" (%ga, %a) args [0 : index, 1 : index, 0] module "l0" : (tensor<2x10xf32>, tensor<2x10xf32>) -> tensor<2x10xf32>
  %gw0 = fsdp.aten "aten::mm" (%gh, %x) module "l0" : (tensor<2x10xf32>, tensor<2x4xf32>) -> tensor<10x4xf32>
  %gb0 = fsdp.aten "aten::sum.dim_IntList" (%gh) args [0 : index, [0], false] module "l0" : (tensor<2x10xf32>) -> tensor<10xf32>
  fsdp.gradients [@"l0.w", @"l0.b", @"l1.w"] %gw0, %gb0, %gw1 : tensor<10x4xf32>, tensor<10xf32>, tensor<4x10xf32>
  return %l : tensor<f32>
}
