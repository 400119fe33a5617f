// RUN: fsdp-opt %s -split-input-file -canonicalize | FileCheck %s

// A cast to the same type folds away; other casts stay.
// CHECK-LABEL: func.func @cast_identity(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x32xf32>)
// CHECK-NEXT:    %[[C:.*]] = fsdp.cast %[[X]] : tensor<8x32xf32> to tensor<8x32xbf16>
// CHECK-NEXT:    return %[[X]], %[[C]] : tensor<8x32xf32>, tensor<8x32xbf16>
func.func @cast_identity(%x: tensor<8x32xf32>) -> (tensor<8x32xf32>, tensor<8x32xbf16>) {
  %0 = fsdp.cast %x : tensor<8x32xf32> to tensor<8x32xf32>
  %1 = fsdp.cast %0 : tensor<8x32xf32> to tensor<8x32xbf16>
  return %0, %1 : tensor<8x32xf32>, tensor<8x32xbf16>
}

// -----

// Unused casts and get_params are pure and go away.
fsdp.unit @root root
fsdp.param @p : tensor<4xf32> unit @root

// CHECK-LABEL: func.func @dead_pure_ops(
// CHECK-NEXT:    return
func.func @dead_pure_ops(%x: tensor<4xi32>) {
  %0 = fsdp.cast %x : tensor<4xi32> to tensor<4xf32>
  %1 = fsdp.get_param @p : tensor<4xf32>
  return
}

// -----

// An unused non-random fsdp.aten is removed; a random one stays.
// CHECK-LABEL: func.func @aten(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8xf32>)
// CHECK-NOT:     aten::relu
// CHECK-NOT:     aten::ones
// CHECK:         fsdp.aten "aten::dropout"(%[[X]]) args [0 : index, 5.000000e-01, true] random : (tensor<8xf32>) -> tensor<8xf32>
// CHECK-NEXT:    fsdp.aten "aten::rand"() args {{\[}}[8], f32] random : () -> tensor<8xf32>
// CHECK-NEXT:    return
func.func @aten(%x: tensor<8xf32>) {
  %0 = fsdp.aten "aten::relu" (%x) : (tensor<8xf32>) -> tensor<8xf32>
  %1 = fsdp.aten "aten::ones" () args [[8], f32] : () -> tensor<8xf32>
  %2 = fsdp.aten "aten::dropout" (%x) args [0 : index, 0.5, true] random : (tensor<8xf32>) -> tensor<8xf32>
  %3 = fsdp.aten "aten::rand" () args [[8], f32] random : () -> tensor<8xf32>
  return
}

// -----

// Loss and gradients are step results and stay even though nothing uses
// them; collectives and their waits stay even when their results are unused.
shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @w : tensor<10x32xf32> unit @root sharded on @dp axes = [0] padding = 2

// CHECK-LABEL: func.func @markers_and_collectives(
// CHECK-SAME:    %[[L:[^:]*]]: tensor<f32>, %[[S:[^:]*]]: tensor<3x32xf32>, %[[G:[^:]*]]: tensor<10x32xbf16>)
// CHECK-NEXT:    %[[AG:.*]] = fsdp.all_gather_start %[[S]] on @dp axes = [0] : tensor<3x32xf32> -> !fsdp.future<tensor<10x32xbf16>>
// CHECK-NEXT:    %[[FULL:.*]] = fsdp.wait %[[AG]] : !fsdp.future<tensor<10x32xbf16>>
// CHECK-NEXT:    fsdp.reshard %[[FULL]] : tensor<10x32xbf16>
// CHECK-NEXT:    %[[AR:.*]] = fsdp.all_reduce_start %[[L]] on @dp axes = [0] reduction = max reduce_dtype = f32 : tensor<f32> -> !fsdp.future<tensor<f32>>
// CHECK-NEXT:    fsdp.wait %[[AR]] : !fsdp.future<tensor<f32>>
// CHECK-NEXT:    fsdp.loss %[[L]] : tensor<f32>
// CHECK-NEXT:    %[[RS:.*]] = fsdp.reduce_scatter_start %[[G]] on @dp axes = [0] reduction = average reduce_dtype = f32 : tensor<10x32xbf16> -> !fsdp.future<tensor<3x32xf32>>
// CHECK-NEXT:    %[[GS:.*]] = fsdp.wait %[[RS]] : !fsdp.future<tensor<3x32xf32>>
// CHECK-NEXT:    fsdp.gradients [@w] %[[GS]] : tensor<3x32xf32>
// CHECK-NEXT:    return
func.func @markers_and_collectives(%l: tensor<f32>, %s: tensor<3x32xf32>, %g: tensor<10x32xbf16>) {
  %ag = fsdp.all_gather_start %s on @dp axes = [0] : tensor<3x32xf32> -> !fsdp.future<tensor<10x32xbf16>>
  %full = fsdp.wait %ag : !fsdp.future<tensor<10x32xbf16>>
  fsdp.reshard %full : tensor<10x32xbf16>
  %ar = fsdp.all_reduce_start %l on @dp axes = [0] reduction = max reduce_dtype = f32 : tensor<f32> -> !fsdp.future<tensor<f32>>
  %m = fsdp.wait %ar : !fsdp.future<tensor<f32>>
  fsdp.loss %l : tensor<f32>
  %rs = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 : tensor<10x32xbf16> -> !fsdp.future<tensor<3x32xf32>>
  %gs = fsdp.wait %rs : !fsdp.future<tensor<3x32xf32>>
  fsdp.gradients [@w] %gs : tensor<3x32xf32>
  return
}

// -----

// An all-gather whose gathered buffer is never used nor freed still stays:
// the collective is on the communication stream.
shard.grid @dp(shape = 4)

// CHECK-LABEL: func.func @unused_all_gather(
// CHECK-NEXT:    %[[AG:.*]] = fsdp.all_gather_start
// CHECK-NEXT:    fsdp.wait %[[AG]]
// CHECK-NEXT:    return
func.func @unused_all_gather(%s: tensor<3xf32>) {
  %ag = fsdp.all_gather_start %s on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %full = fsdp.wait %ag : !fsdp.future<tensor<12xf32>>
  return
}
