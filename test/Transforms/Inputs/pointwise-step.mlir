// A CUDA step with two generated kernels, one over same-shape inputs and
// one with a broadcast row. step-time.mlir's KERNELS.
module attributes {fsdp.device = "cuda"} {
fsdp.unit @root root class "Net"
fsdp.param @w : tensor<1000x1000xf32> unit @root
fsdp.param @b : tensor<1000xf32> unit @root
func.func @train_step(%x: tensor<1000x1000xf32>) -> tensor<f32> {
  %w = fsdp.get_param @w : tensor<1000x1000xf32>
  %b = fsdp.get_param @b : tensor<1000xf32>
  %same = fsdp.pointwise(%x, %w) module "dense" : (tensor<1000x1000xf32>, tensor<1000x1000xf32>) -> tensor<1000x1000xf32> {
  ^bb0(%a: tensor<1000x1000xf32>, %c: tensor<1000x1000xf32>):
    %m = fsdp.aten "aten::mul.Tensor"(%a, %c) : (tensor<1000x1000xf32>, tensor<1000x1000xf32>) -> tensor<1000x1000xf32>
    fsdp.yield %m : tensor<1000x1000xf32>
  }
  %broadcast = fsdp.pointwise(%same, %b) module "bias" : (tensor<1000x1000xf32>, tensor<1000xf32>) -> tensor<1000x1000xf32> {
  ^bb0(%a: tensor<1000x1000xf32>, %c: tensor<1000xf32>):
    %m = fsdp.aten "aten::mul.Tensor"(%a, %c) : (tensor<1000x1000xf32>, tensor<1000xf32>) -> tensor<1000x1000xf32>
    fsdp.yield %m : tensor<1000x1000xf32>
  }
  %l = fsdp.aten "aten::sum"(%broadcast) : (tensor<1000x1000xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %gw = fsdp.aten "aten::mul.Tensor"(%x, %x) : (tensor<1000x1000xf32>, tensor<1000x1000xf32>) -> tensor<1000x1000xf32>
  %gb = fsdp.aten "aten::sum.dim_IntList"(%gw) args [0 : index, [0], false] : (tensor<1000x1000xf32>) -> tensor<1000xf32>
  fsdp.gradients [@w, @b] %gw, %gb : tensor<1000x1000xf32>, tensor<1000xf32>
  return %l : tensor<f32>
}
}
