// RUN: fsdp-opt %s -split-input-file --fsdp-test-live-bytes | FileCheck %s --check-prefix=RELEASES
// RUN: fsdp-opt %s -split-input-file --fsdp-test-live-bytes="frees=last-use" | FileCheck %s --check-prefix=LAST-USE
// RUN: not fsdp-opt %s -split-input-file --fsdp-test-live-bytes="frees=never" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: fsdp-opt %s -split-input-file --fsdp-test-live-bytes="backend=gloo" | FileCheck %s --check-prefix=GLOO

// A clone, its product (64 bytes each), a view of the product and its sum
// (4 bytes, the loss): with the releases the step holds, and by last use,
// the same bytes after each op (the clone dies at the product, the product
// with its view at the sum). On the same step without releases the last-use
// rule still frees them there; the runtime's rule keeps them to the end.
// RELEASES:  func.func @released(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 128, 64, 68, 4, 4>, test.live_peak = 128 : i64}
// LAST-USE:  func.func @released(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 128, 64, 68, 4, 4>, test.live_peak = 128 : i64}
// BAD: frees must be releases or last-use, got 'never'
func.func @released(%x: tensor<4x4xf32>) -> tensor<f32> {
  %a = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %b = fsdp.aten "aten::mul.Tensor"(%a, %a) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  fsdp.release %a : tensor<4x4xf32>
  %v = fsdp.aten "aten::view"(%b) args [0 : index, [16]] : (tensor<4x4xf32>) -> tensor<16xf32>
  %l = fsdp.aten "aten::sum"(%v) : (tensor<16xf32>) -> tensor<f32>
  fsdp.release %b, %v : tensor<4x4xf32>, tensor<16xf32>
  fsdp.loss %l : tensor<f32>
  return %l : tensor<f32>
}

// -----

// RELEASES:  func.func @unreleased(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 128, 128, 132, 132, 132>, test.live_peak = 132 : i64}
// LAST-USE:  func.func @unreleased(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 128, 64, 68, 4, 4>, test.live_peak = 128 : i64}
func.func @unreleased(%x: tensor<4x4xf32>) -> tensor<f32> {
  %a = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %b = fsdp.aten "aten::mul.Tensor"(%a, %a) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %v = fsdp.aten "aten::view"(%b) args [0 : index, [16]] : (tensor<4x4xf32>) -> tensor<16xf32>
  %l = fsdp.aten "aten::sum"(%v) : (tensor<16xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  return %l : tensor<f32>
}

// -----

// A 64-byte gradient reduce-scattered over 2 ranks into its 32-byte shard,
// after the loss (4 bytes). On NCCL the start stages the packed buffer (64)
// and the receive buffer (32), and the shard is a view of the receive
// buffer: the wait holds 100 (the gradient freed), not 132, and only the
// shard is left after it. On Gloo the packed buffer is reduced in place and
// the wait copies this rank's row out of it: 100 as well.
// RELEASES: func.func @reduced(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 68, 68, 164, 100, 36, 36>, test.live_peak = 164 : i64}
// GLOO:     func.func @reduced(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 68, 68, 132, 100, 36, 36>, test.live_peak = 132 : i64}
shard.grid @dp(shape = 2)
fsdp.unit @root root
fsdp.param @w : tensor<4x4xf32> unit @root sharded on @dp axes = [0] padding = 0
func.func @reduced(%x: tensor<4x4xf32>) -> tensor<f32> {
  %g = fsdp.aten "aten::mul.Tensor"(%x, %x) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %l = fsdp.aten "aten::sum"(%g) : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 unit @root : tensor<4x4xf32> -> !fsdp.future<tensor<2x4xf32>>
  fsdp.release %g : tensor<4x4xf32>
  %s = fsdp.wait %f : !fsdp.future<tensor<2x4xf32>>
  fsdp.gradients [@w] %s : tensor<2x4xf32>
  return %l : tensor<f32>
}

// -----

// Over one rank NCCL reduces the packed buffer in place and it is the
// result: 64 bytes from the start on, no second copy at the wait.
// RELEASES: func.func @one_rank(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 68, 68, 132, 68, 68, 68>, test.live_peak = 132 : i64}
shard.grid @dp(shape = 1)
fsdp.unit @root root
fsdp.param @w : tensor<4x4xf32> unit @root sharded on @dp axes = [0] padding = 0
func.func @one_rank(%x: tensor<4x4xf32>) -> tensor<f32> {
  %g = fsdp.aten "aten::mul.Tensor"(%x, %x) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %l = fsdp.aten "aten::sum"(%g) : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 unit @root : tensor<4x4xf32> -> !fsdp.future<tensor<4x4xf32>>
  fsdp.release %g : tensor<4x4xf32>
  %s = fsdp.wait %f : !fsdp.future<tensor<4x4xf32>>
  fsdp.gradients [@w] %s : tensor<4x4xf32>
  return %l : tensor<f32>
}

// -----

// A bf16 gradient (32 bytes) reduced in f32 and cast back at the wait: the
// 16-byte bf16 shard is allocated beside the f32 buffers (96) until they
// are freed after the wait.
// RELEASES: func.func @cast_back(%arg0: tensor<4x4xbf16>) -> tensor<bf16> attributes {test.live_after = array<i64: 32, 34, 34, 130, 114, 18, 18>, test.live_peak = 130 : i64}
shard.grid @dp(shape = 2)
fsdp.unit @root root
fsdp.param @w : tensor<4x4xbf16> unit @root sharded on @dp axes = [0] padding = 0
func.func @cast_back(%x: tensor<4x4xbf16>) -> tensor<bf16> {
  %g = fsdp.aten "aten::mul.Tensor"(%x, %x) : (tensor<4x4xbf16>, tensor<4x4xbf16>) -> tensor<4x4xbf16>
  %l = fsdp.aten "aten::sum"(%g) : (tensor<4x4xbf16>) -> tensor<bf16>
  fsdp.loss %l : tensor<bf16>
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 unit @root : tensor<4x4xbf16> -> !fsdp.future<tensor<2x4xbf16>>
  fsdp.release %g : tensor<4x4xbf16>
  %s = fsdp.wait %f : !fsdp.future<tensor<2x4xbf16>>
  fsdp.gradients [@w] %s : tensor<2x4xbf16>
  return %l : tensor<bf16>
}

// -----

// An all-reduce across replicas reduces its packed buffer (32 bytes) in
// place on either backend, and the result is a view of it: 36 at the wait
// (the input freed), not 68.
// RELEASES: func.func @replicas(%arg0: tensor<2x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 32, 36, 36, 68, 36, 36, 36>, test.live_peak = 68 : i64}
// GLOO:     func.func @replicas(%arg0: tensor<2x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 32, 36, 36, 68, 36, 36, 36>, test.live_peak = 68 : i64}
shard.grid @dp(shape = 2x2)
fsdp.unit @root root
fsdp.param @w : tensor<4x4xf32> unit @root sharded on @dp axes = [1] padding = 0
func.func @replicas(%x: tensor<2x4xf32>) -> tensor<f32> {
  %g = fsdp.aten "aten::mul.Tensor"(%x, %x) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %l = fsdp.aten "aten::sum"(%g) : (tensor<2x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 unit @root : tensor<2x4xf32> -> !fsdp.future<tensor<2x4xf32>>
  fsdp.release %g : tensor<2x4xf32>
  %s = fsdp.wait %f : !fsdp.future<tensor<2x4xf32>>
  fsdp.gradients [@w] %s : tensor<2x4xf32>
  return %l : tensor<f32>
}

// -----

// One bucket of an f32 and a bf16 gradient (64 and 32 bytes), reduced in
// f32 over 2 ranks on NCCL: the start stages the packed buffer (128) and
// the receive buffer (64). At the wait the f32 shard is a view of the
// receive buffer and the bf16 shard (16) a cast of its part: 4 + 128 + 64 +
// 16 = 212. After it the view keeps the whole receive buffer: 4 + 64 + 16.
// RELEASES: func.func @mixed(%arg0: tensor<4x4xf32>, %arg1: tensor<4x4xbf16>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 96, 100, 100, 292, 212, 84, 84>, test.live_peak = 292 : i64}
shard.grid @dp(shape = 2)
fsdp.unit @root root
fsdp.param @w : tensor<4x4xf32> unit @root sharded on @dp axes = [0] padding = 0
fsdp.param @v : tensor<4x4xbf16> unit @root sharded on @dp axes = [0] padding = 0
func.func @mixed(%x: tensor<4x4xf32>, %y: tensor<4x4xbf16>) -> tensor<f32> {
  %g = fsdp.aten "aten::mul.Tensor"(%x, %x) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %h = fsdp.aten "aten::mul.Tensor"(%y, %y) : (tensor<4x4xbf16>, tensor<4x4xbf16>) -> tensor<4x4xbf16>
  %l = fsdp.aten "aten::sum"(%g) : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %f = fsdp.reduce_scatter_start %g, %h on @dp axes = [0] reduction = average reduce_dtype = f32 unit @root : tensor<4x4xf32>, tensor<4x4xbf16> -> !fsdp.future<tensor<2x4xf32>, tensor<2x4xbf16>>
  fsdp.release %g, %h : tensor<4x4xf32>, tensor<4x4xbf16>
  %s:2 = fsdp.wait %f : !fsdp.future<tensor<2x4xf32>, tensor<2x4xbf16>>
  fsdp.gradients [@w, @v] %s#0, %s#1 : tensor<2x4xf32>, tensor<2x4xbf16>
  return %l : tensor<f32>
}
