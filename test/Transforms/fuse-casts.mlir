// RUN: fsdp-opt %s --fsdp-shard-parameters="ranks=2" --fsdp-reshard-after-forward --fsdp-fuse-casts | FileCheck %s
// RUN: fsdp-opt %s --fsdp-shard-parameters="ranks=2" --fsdp-reshard-after-forward --fsdp-fuse-casts="reduce-dtype=bf16" | FileCheck %s --check-prefix=BF16
// RUN: fsdp-opt %s --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward --fsdp-fuse-casts="reduce-dtype=f16" | FileCheck %s --check-prefix=F16
// RUN: fsdp-opt %s --fsdp-shard-parameters="ranks=4 gradient-divide-factor=32" --fsdp-reshard-after-forward --fsdp-fuse-casts="reduce-dtype=f16" | FileCheck %s --check-prefix=F16-DIVIDE
// RUN: not fsdp-opt %s --fsdp-fuse-casts="reduce-dtype=f8" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: fsdp-opt %S/Inputs/synced-step.mlir --fsdp-shard-parameters="ranks=2" --fsdp-fuse-casts="reduce-dtype=f16" | FileCheck %s --check-prefix=SYNCED

// FSDP2 mixed precision as capture writes it: the f32 master weight is cast
// to bf16 where it is used, and its bf16 gradient cast back to f32.
module attributes {fsdp.mixed_precision = {param_dtype = bf16, reduce_dtype = f32, cast_forward_inputs = true}} {
  fsdp.unit @root root
  fsdp.param @w : tensor<6x4xf32> unit @root
  func.func @train_step(%x: tensor<2x6xbf16>) -> tensor<f32> {
    %w = fsdp.get_param @w : tensor<6x4xf32>
    %wb = fsdp.cast %w : tensor<6x4xf32> to tensor<6x4xbf16>
    %y = fsdp.aten "aten::mm" (%x, %wb) : (tensor<2x6xbf16>, tensor<6x4xbf16>) -> tensor<2x4xbf16>
    %s = fsdp.aten "aten::sum" (%y) : (tensor<2x4xbf16>) -> tensor<bf16>
    %l = fsdp.cast %s : tensor<bf16> to tensor<f32>
    fsdp.loss %l : tensor<f32>
    %gwb = fsdp.aten "aten::mm" (%x, %y) : (tensor<2x6xbf16>, tensor<2x4xbf16>) -> tensor<6x4xbf16>
    %gw = fsdp.cast %gwb : tensor<6x4xbf16> to tensor<6x4xf32>
    fsdp.gradients [@w] %gw : tensor<6x4xf32>
    return %l : tensor<f32>
  }
}

// The cast moves into the all-gather's copy-in: bf16 on the wire, no cast op.
// CHECK:      %[[S:.*]] = fsdp.get_param @w : tensor<3x4xf32>
// CHECK-NEXT: %[[F:.*]] = fsdp.all_gather_start %[[S]] on @fsdp_grid axes = [0] unit @root : tensor<3x4xf32> -> !fsdp.future<tensor<6x4xbf16>>
// CHECK-NEXT: %[[W:.*]] = fsdp.wait %[[F]] : !fsdp.future<tensor<6x4xbf16>>
// CHECK-NEXT: fsdp.aten "aten::mm"(%arg0, %[[W]])
// The gradient enters the reduce-scatter in bf16, widened to f32 as packed;
// the shard comes out in the parameter's f32.
// CHECK:      %[[G:.*]] = fsdp.aten "aten::mm"(%arg0, %{{.*}}) : (tensor<2x6xbf16>, tensor<2x4xbf16>) -> tensor<6x4xbf16>
// CHECK-NEXT: fsdp.reduce_scatter_start %[[G]] on @fsdp_grid axes = [0] reduction = average reduce_dtype = f32 unit @root : tensor<6x4xbf16> -> !fsdp.future<tensor<3x4xf32>>
// CHECK-NOT:  fsdp.cast %{{.*}} : tensor<6x4xbf16> to tensor<6x4xf32>

// BF16: fsdp.reduce_scatter_start %{{.*}} reduction = average reduce_dtype = bf16

// f16 reductions sum with pre/post division instead of averaging.
// F16: fsdp.reduce_scatter_start %{{.*}} reduction = sum reduce_dtype = f16 pre_divide = 2.000000e+00 post_divide = 2.000000e+00
// A gradient divide factor's sum is split the same way once the reduction is in f16.
// F16-DIVIDE: fsdp.reduce_scatter_start %{{.*}} reduction = sum reduce_dtype = f16 pre_divide = 4.000000e+00 post_divide = 8.000000e+00

// BAD: error: reduce-dtype must be f32, bf16 or f16, got 'f8'

// A sum of activations over the ranks (SyncBatchNorm's statistics) keeps
// its own dtype under a low-precision reduce dtype, which is the
// gradients': before 2026-11-28 it was summed in f16 too, where a count of
// 100352 elements overflows.
// SYNCED-COUNT-2: fsdp.all_reduce_start %{{.*}} reduction = sum reduce_dtype = f32 : tensor<6xf32>
// SYNCED: fsdp.reduce_scatter_start %{{.*}} reduce_dtype = f16
