// RUN: fsdp-opt %s -split-input-file --fsdp-gather-into-results | FileCheck %s
// RUN: fsdp-opt %s -split-input-file --fsdp-test-live-bytes | FileCheck %s --check-prefix=THROUGH
// RUN: fsdp-opt %s -split-input-file --fsdp-gather-into-results --fsdp-test-live-bytes | FileCheck %s --check-prefix=INTO
// RUN: not fsdp-opt %s -split-input-file --fsdp-gather-into-results="backend=gloo" 2>&1 | FileCheck %s --check-prefix=GLOO

// A 3-row parameter over 2 ranks (2-row shards, one padding row), in f32:
// 32 bytes of shard. Through the receive buffer (NCCL): the start packs the
// shard into its row of the 64-byte receive buffer and gathers in place
// (64); the wait allocates the 48-byte result beside it (112) and frees it;
// the mm adds 64 (112). Into the results: the start allocates the result
// padded to 4 rows (64), casts its shard into place and gathers in place,
// staging nothing; the mm adds 64 (128). With a third of the padded result
// padding, the padding row it keeps costs more than the moment the buffer
// and the result coexist (112 against 128); on a large parameter that
// moment is nearly twice the result, and the copy-out goes too.
shard.grid @dp(shape = 2)
fsdp.unit @root root
fsdp.param @w : tensor<3x4xf32> unit @root sharded on @dp axes = [0] padding = 1
// CHECK-LABEL: func.func @step(
// CHECK:         fsdp.all_gather_start %{{.*}} on @dp axes = [0] into_results : tensor<2x4xf32> -> !fsdp.future<tensor<3x4xf32>>
// THROUGH:       func.func @step(%arg0: tensor<4x3xf32>) attributes {test.live_after = array<i64: 0, 64, 112, 112, 112, 68, 68, 68>, test.live_peak = 112 : i64}
// INTO:          func.func @step(%arg0: tensor<4x3xf32>) attributes {test.live_after = array<i64: 0, 64, 64, 128, 128, 68, 68, 68>, test.live_peak = 128 : i64}
// GLOO:          gather-into-results needs backend=nccl, got 'gloo'
func.func @step(%x: tensor<4x3xf32>) {
  %s = fsdp.get_param @w : tensor<2x4xf32>
  %f = fsdp.all_gather_start %s on @dp axes = [0] : tensor<2x4xf32> -> !fsdp.future<tensor<3x4xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<3x4xf32>>
  %y = fsdp.aten "aten::mm" (%x, %g) : (tensor<4x3xf32>, tensor<3x4xf32>) -> tensor<4x4xf32>
  fsdp.reshard %g : tensor<3x4xf32>
  %l = fsdp.aten "aten::sum" (%y) : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  return
}

// -----

// An offloaded unit's all-gather copies its shards in on the host-to-device
// stream, through the receive buffer: left as it is.
shard.grid @dp(shape = 2)
fsdp.unit @root root offloaded
fsdp.param @w : tensor<4x4xf32> unit @root sharded on @dp axes = [0] padding = 0
// CHECK-LABEL: func.func @host(
// CHECK:         fsdp.all_gather_start %{{.*}} on @dp axes = [0] unit @root host : tensor<2x4xf32>
func.func @host(%x: tensor<4x4xf32>) {
  %s = fsdp.get_param @w : tensor<2x4xf32>
  %f = fsdp.all_gather_start %s on @dp axes = [0] unit @root host : tensor<2x4xf32> -> !fsdp.future<tensor<4x4xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<4x4xf32>>
  %y = fsdp.aten "aten::mm" (%x, %g) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  fsdp.reshard %g : tensor<4x4xf32>
  %l = fsdp.aten "aten::sum" (%y) : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  return
}
