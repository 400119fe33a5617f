// A backward call marked as in a checkpoint region (activation-checkpoint.mlir).
func.func @f(%x: tensor<4xf32>) -> tensor<f32> {
  %l = fsdp.aten "aten::sum" (%x) module "" : (tensor<4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  // The line the error names.
  %g = fsdp.aten "aten::neg" (%x) module "l0" checkpoint 0 : (tensor<4xf32>) -> tensor<4xf32>
  return %l : tensor<f32>
}
