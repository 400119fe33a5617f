// A captured convolution whose backward leaves the input's gradient out
// (`none`): its input is the batch.
fsdp.unit @root root class "Net"
fsdp.param @"w" : tensor<8x3x3x3xf32> unit @root
func.func @train_step(%x: tensor<4x3x5x5xf32>) -> tensor<f32> {
  %w = fsdp.get_param @"w" : tensor<8x3x3x3xf32>
  %y = fsdp.aten "aten::convolution" (%x, %w) args [0 : index, 1 : index, unit, [1, 1], [0, 0], [1, 1], false, [0, 0], 1] module "" : (tensor<4x3x5x5xf32>, tensor<8x3x3x3xf32>) -> tensor<4x8x3x3xf32>
  %l = fsdp.aten "aten::sum" (%y) module "" : (tensor<4x8x3x3xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %g = fsdp.aten "aten::ones" () args [[4, 8, 3, 3], f32] module "" : () -> tensor<4x8x3x3xf32>
  %gi:3 = fsdp.aten "aten::convolution_backward" (%g, %x, %w) args [0 : index, 1 : index, 2 : index, unit, [1, 1], [0, 0], [1, 1], false, [0, 0], 1, [false, true, false]] module "" : (tensor<4x8x3x3xf32>, tensor<4x3x5x5xf32>, tensor<8x3x3x3xf32>) -> (none, tensor<8x3x3x3xf32>, none)
  fsdp.gradients [@"w"] %gi#1 : tensor<8x3x3x3xf32>
  return %l : tensor<f32>
}
