// RUN: fsdp-opt %s -split-input-file -verify-diagnostics

// Negative tests for offloaded units and `host` collectives.

shard.grid @dp(shape = 2)
fsdp.unit @l0
fsdp.param @w : tensor<4xf32> unit @l0 sharded on @dp axes = [0] padding = 0
func.func @f() {
  %w = fsdp.get_param @w : tensor<2xf32>
  // expected-error @+1 {{'fsdp.all_gather_start' op is `host`, but its unit @l0 is not offloaded}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] unit @l0 host : tensor<2xf32> -> !fsdp.future<tensor<4xf32>>
  %full = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 2)
fsdp.unit @l0 offloaded
fsdp.param @w : tensor<4xf32> unit @l0 sharded on @dp axes = [0] padding = 0
func.func @f() {
  // expected-error @+1 {{'fsdp.get_param' op reads @w of offloaded unit @l0, a shard in host memory, which only a `host` all-gather may read; fsdp.aten at}}
  %w = fsdp.get_param @w : tensor<2xf32>
  %y = fsdp.aten "aten::neg" (%w) : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

shard.grid @dp(shape = 2)
fsdp.unit @l0 offloaded
fsdp.param @w : tensor<4xf32> unit @l0 sharded on @dp axes = [0] padding = 0
func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op is `host`, but input 0 is not a parameter shard (fsdp.get_param)}}
  %f = fsdp.all_gather_start %x on @dp axes = [0] unit @l0 host : tensor<4xf32> -> !fsdp.future<tensor<8xf32>>
  %full = fsdp.wait %f : !fsdp.future<tensor<8xf32>>
  return
}

// -----

shard.grid @dp(shape = 2)
// expected-error @+1 {{'fsdp.param' op belongs to offloaded unit @l0 but is not sharded}}
fsdp.param @w : tensor<4xf32> unit @l0
fsdp.unit @l0 offloaded

// -----

shard.grid @dp(shape = 2)
fsdp.unit @l0 offloaded
fsdp.param @w : tensor<4xf32> unit @l0 sharded on @dp axes = [0] padding = 0
func.func @f(%g: tensor<4xf32>) {
  %l = fsdp.aten "aten::sum" (%g) : (tensor<4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %r = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 unit @l0 : tensor<4xf32> -> !fsdp.future<tensor<2xf32>>
  %s = fsdp.wait %r : !fsdp.future<tensor<2xf32>>
  // expected-error @+1 {{'fsdp.gradients' op gradient of @w (offloaded unit @l0) must come from a `host` reduction}}
  fsdp.gradients [@w] %s : tensor<2xf32>
  return
}

// -----

shard.grid @dp(shape = 2)
fsdp.unit @l0 offloaded
fsdp.param @w : tensor<4xf32> unit @l0 sharded on @dp axes = [0] padding = 0
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op delivers its results to host memory, but fsdp.aten at}}
  %r = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 unit @l0 host : tensor<4xf32> -> !fsdp.future<tensor<2xf32>>
  %s = fsdp.wait %r : !fsdp.future<tensor<2xf32>>
  %y = fsdp.aten "aten::neg" (%s) : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

shard.grid @dp(shape = 2)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op is `host`, but names no unit}}
  %r = fsdp.all_reduce_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 host : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %r : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 2)
fsdp.unit @l0 offloaded
fsdp.param @w : tensor<4xf32> unit @l0 sharded on @dp axes = [0] padding = 0
func.func @f() {
  %w = fsdp.get_param @w : tensor<2xf32>
  // expected-error @+1 {{'fsdp.all_gather_start' op is `host` and `into_results`: a host bucket is copied in on the host-to-device stream and gathered through a receive buffer}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] unit @l0 host into_results : tensor<2xf32> -> !fsdp.future<tensor<4xf32>>
  %full = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 2)
fsdp.unit @l0 offloaded
fsdp.param @w : tensor<4xf32> unit @l0 sharded on @dp axes = [0] padding = 0
func.func @f(%g: tensor<4xf32>) {
  %l = fsdp.aten "aten::sum" (%g) : (tensor<4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op delivers unit @l0's gradients to host memory, where its optimizer may step the shards at once, but the all-gather at}}
  %r = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 unit @l0 host : tensor<4xf32> -> !fsdp.future<tensor<2xf32>>
  %s = fsdp.wait %r : !fsdp.future<tensor<2xf32>>
  %w = fsdp.get_param @w : tensor<2xf32>
  %a = fsdp.all_gather_start %w on @dp axes = [0] unit @l0 host : tensor<2xf32> -> !fsdp.future<tensor<4xf32>>
  %full = fsdp.wait %a : !fsdp.future<tensor<4xf32>>
  fsdp.gradients [@w] %s : tensor<2xf32>
  return
}
