// A captured training step of a two-layer MLP, as the Python frontend writes it:
// parameters by FQN, one wrap unit per Linear plus the root, forward, the loss
// marker, backward, and the gradients handed to the optimizer. Nothing is
// sharded yet.
//
//   model = Sequential(fc1=Linear(16, 32), ReLU(), fc2=Linear(32, 10))
//   loss  = mse_loss(model(x), target)

fsdp.unit @root root class "Sequential"
fsdp.unit @fc1 class "Linear"

fsdp.param @"fc1.weight" : tensor<32x16xf32> unit @fc1
fsdp.param @"fc1.bias" : tensor<32xf32> unit @fc1
fsdp.param @"fc2.weight" : tensor<10x32xf32> unit @root
fsdp.param @"fc2.bias" : tensor<10xf32> unit @root

func.func @train_step(%x: tensor<8x16xf32>, %target: tensor<8x10xf32>) -> tensor<f32> {
  // Forward.
  %w1 = fsdp.get_param @"fc1.weight" : tensor<32x16xf32>
  %b1 = fsdp.get_param @"fc1.bias" : tensor<32xf32>
  %w1t = fsdp.aten "aten::t" (%w1) : (tensor<32x16xf32>) -> tensor<16x32xf32>
  %h = fsdp.aten "aten::addmm" (%b1, %x, %w1t) : (tensor<32xf32>, tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
  %a = fsdp.aten "aten::relu" (%h) : (tensor<8x32xf32>) -> tensor<8x32xf32>
  %w2 = fsdp.get_param @"fc2.weight" : tensor<10x32xf32>
  %b2 = fsdp.get_param @"fc2.bias" : tensor<10xf32>
  %w2t = fsdp.aten "aten::t" (%w2) : (tensor<10x32xf32>) -> tensor<32x10xf32>
  %y = fsdp.aten "aten::addmm" (%b2, %a, %w2t) : (tensor<10xf32>, tensor<8x32xf32>, tensor<32x10xf32>) -> tensor<8x10xf32>
  %loss = fsdp.aten "aten::mse_loss" (%y, %target) args [0 : index, 1 : index, 1] : (tensor<8x10xf32>, tensor<8x10xf32>) -> tensor<f32>
  fsdp.loss %loss : tensor<f32>

  // Backward.
  %seed = fsdp.aten "aten::ones_like" (%loss) : (tensor<f32>) -> tensor<f32>
  %gy = fsdp.aten "aten::mse_loss_backward" (%seed, %y, %target) args [0 : index, 1 : index, 2 : index, 1] : (tensor<f32>, tensor<8x10xf32>, tensor<8x10xf32>) -> tensor<8x10xf32>
  %gyt = fsdp.aten "aten::t" (%gy) : (tensor<8x10xf32>) -> tensor<10x8xf32>
  %gw2 = fsdp.aten "aten::mm" (%gyt, %a) : (tensor<10x8xf32>, tensor<8x32xf32>) -> tensor<10x32xf32>
  %gb2 = fsdp.aten "aten::sum.dim_IntList" (%gy) args [0 : index, [0], false] : (tensor<8x10xf32>) -> tensor<10xf32>
  %ga = fsdp.aten "aten::mm" (%gy, %w2) : (tensor<8x10xf32>, tensor<10x32xf32>) -> tensor<8x32xf32>
  %gh = fsdp.aten "aten::threshold_backward" (%ga, %a) args [0 : index, 1 : index, 0.0] : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
  %ght = fsdp.aten "aten::t" (%gh) : (tensor<8x32xf32>) -> tensor<32x8xf32>
  %gw1 = fsdp.aten "aten::mm" (%ght, %x) : (tensor<32x8xf32>, tensor<8x16xf32>) -> tensor<32x16xf32>
  %gb1 = fsdp.aten "aten::sum.dim_IntList" (%gh) args [0 : index, [0], false] : (tensor<8x32xf32>) -> tensor<32xf32>
  fsdp.gradients [@"fc1.weight", @"fc1.bias", @"fc2.weight", @"fc2.bias"] %gw1, %gb1, %gw2, %gb2
      : tensor<32x16xf32>, tensor<32xf32>, tensor<10x32xf32>, tensor<10xf32>
  return %loss : tensor<f32>
}
