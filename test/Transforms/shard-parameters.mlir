// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4 strategy=hybrid-shard replicas=2" | FileCheck %s --check-prefix=HSDP
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=8 strategy=no-shard" | FileCheck %s --check-prefix=DDP
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=8 reshard-group=2" | FileCheck %s --check-prefix=GROUP
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4 gradient-accumulation=true" | FileCheck %s --check-prefix=ACCUM
// RUN: fsdp-opt %S/Inputs/scalar-step.mlir --fsdp-shard-parameters="ranks=4" | FileCheck %s --check-prefix=SCALAR
// RUN: fsdp-opt %S/Inputs/scalar-step.mlir --fsdp-shard-parameters="ranks=4 strategy=hybrid-shard replicas=2" | FileCheck %s --check-prefix=SCALAR-HSDP
// RUN: fsdp-opt %S/Inputs/scalar-step.mlir --fsdp-shard-parameters="ranks=8 reshard-group=2" | FileCheck %s --check-prefix=SCALAR-GROUP
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4 gradient-divide-factor=1" | FileCheck %s --check-prefix=SUMMED
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4 strategy=hybrid-shard replicas=2 gradient-divide-factor=2.5" | FileCheck %s --check-prefix=DIVIDE-HSDP
// RUN: fsdp-opt %S/Inputs/scalar-step.mlir --fsdp-shard-parameters="ranks=4 gradient-divide-factor=16" | FileCheck %s --check-prefix=DIVIDE-SCALAR
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4 gradient-divide-factor=-2" 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// RUN: not fsdp-opt %s -split-input-file --fsdp-shard-parameters="ranks=4 gradient-divide-factor=64" 2>/dev/null | FileCheck %s --check-prefix=HALF-DIVIDE
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4 ignored-params=l0.b,l1.w" | FileCheck %s --check-prefix=IGNORED
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4 strategy=no-shard gradient-accumulation=true ignored-params=l1.w" | FileCheck %s --check-prefix=IGNORED-ACCUM
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4 ignored-params=l1.weight" 2>&1 | FileCheck %s --check-prefix=IGNORED-UNKNOWN
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=2 strategy=hybrid-shard replicas=2 ignored-params=l1.w" | FileCheck %s --check-prefix=IGNORED-HSDP
// RUN: fsdp-opt %s -split-input-file -verify-diagnostics --fsdp-shard-parameters="ranks=4"
// RUN: not fsdp-opt %s -split-input-file --fsdp-shard-parameters="ranks=4" 2>/dev/null | FileCheck %s --check-prefix=HALF
// RUN: fsdp-opt %S/Inputs/synced-step.mlir --fsdp-shard-parameters="ranks=4" | FileCheck %s --check-prefix=SYNCED
// RUN: fsdp-opt %S/Inputs/synced-step.mlir --fsdp-shard-parameters="ranks=2 strategy=hybrid-shard replicas=2 gradient-accumulation=true" | FileCheck %s --check-prefix=SYNCED-HSDP

// Ignored parameters (FSDP2's ignored_params) stay whole on every rank, are
// read without a gather, and keep this rank's own gradient; the others are
// sharded as ever.
// IGNORED:      fsdp.param @l0.w : tensor<10x4xf32> unit @l0 sharded on @fsdp_grid axes = [0] padding = 2
// IGNORED:      fsdp.param @l0.b : tensor<10xf32> unit @l0 ignored{{$}}
// IGNORED:      fsdp.param @l1.w : tensor<4x10xf32> unit @l1 ignored{{$}}
// IGNORED:      %[[B:.*]] = fsdp.get_param @l0.b : tensor<10xf32>
// IGNORED-NOT:  fsdp.all_gather_start %[[B]]
// IGNORED:      %[[W1:.*]] = fsdp.get_param @l1.w : tensor<4x10xf32>
// IGNORED-NEXT: fsdp.aten "aten::t"(%[[W1]])
// IGNORED:      fsdp.loss
// IGNORED:      %[[GW1:.*]] = fsdp.aten "aten::mm"({{.*}}) module "l1" : (tensor<2x4xf32>, tensor<2x10xf32>)
// IGNORED-NOT:  fsdp.all_reduce_start
// IGNORED:      %[[GW0:.*]] = fsdp.aten "aten::mm"(%{{.*}}, %arg0) module "l0"
// IGNORED-NEXT: %[[RS:.*]] = fsdp.reduce_scatter_start %[[GW0]]
// IGNORED-NEXT: %[[W0S:.*]] = fsdp.wait %[[RS]]
// IGNORED-NEXT: %[[GB0:.*]] = fsdp.aten "aten::sum.dim_IntList"
// IGNORED-NOT:  fsdp.reduce_scatter_start
// IGNORED-NOT:  fsdp.all_reduce_start
// IGNORED:      fsdp.gradients [@l0.w, @l0.b, @l1.w] %[[W0S]], %[[GB0]], %[[GW1]] : tensor<3x4xf32>, tensor<10xf32>, tensor<4x10xf32>
// With accumulation the synchronized step adds what accumulated, and
// reduces only what is not ignored (no-shard: an all-reduce).
// IGNORED-ACCUM:      fsdp.param @l1.w : tensor<4x10xf32> unit @l1 ignored{{$}}
// IGNORED-ACCUM-LABEL: func.func @train_step(
// IGNORED-ACCUM:      %[[ACC:.*]] = fsdp.get_accumulated_grad @l1.w : tensor<4x10xf32>
// IGNORED-ACCUM-NEXT: %[[SUM:.*]] = fsdp.aten "aten::add.Tensor"(%{{.*}}, %[[ACC]])
// IGNORED-ACCUM-NOT:  fsdp.all_reduce_start %[[SUM]]
// IGNORED-ACCUM:      fsdp.all_reduce_start
// IGNORED-ACCUM:      fsdp.all_reduce_start
// IGNORED-ACCUM-NOT:  fsdp.all_reduce_start
// IGNORED-ACCUM:      fsdp.gradients [@l0.w, @l0.b, @l1.w] %{{.*}}, %{{.*}}, %[[SUM]] :
// IGNORED-ACCUM-LABEL: func.func @train_step_no_sync(
// IGNORED-UNKNOWN: error: ignored-params names 'l1.weight', which is no parameter of the step
// Hybrid sharding: an ignored gradient is reduced neither within a replica
// nor across replicas.
// IGNORED-HSDP:      fsdp.param @l1.w : tensor<4x10xf32> unit @l1 ignored{{$}}
// IGNORED-HSDP:      %[[GW1:.*]] = fsdp.aten "aten::mm"({{.*}}) module "l1" : (tensor<2x4xf32>, tensor<2x10xf32>)
// IGNORED-HSDP-NOT:  %[[GW1]]
// IGNORED-HSDP:      fsdp.reduce_scatter_start
// IGNORED-HSDP:      fsdp.reduce_scatter_start
// IGNORED-HSDP-NOT:  fsdp.reduce_scatter_start
// IGNORED-HSDP:      fsdp.all_reduce_start {{.*}} axes = [0]
// IGNORED-HSDP:      fsdp.all_reduce_start {{.*}} axes = [0]
// IGNORED-HSDP-NOT:  fsdp.all_reduce_start
// IGNORED-HSDP:      fsdp.gradients [@l0.w, @l0.b, @l1.w] %{{.*}}, %{{.*}}, %[[GW1]] :

// A scalar has no rows to shard: it stays whole on every rank, is read
// without a gather, and its gradient is averaged over the whole grid.
// SCALAR:      fsdp.param @w : tensor<6x4xf32> unit @root sharded on @fsdp_grid axes = [0] padding = 2
// SCALAR:      fsdp.param @temp : tensor<f32> unit @root{{$}}
// SCALAR:      fsdp.get_param @temp : tensor<f32>
// SCALAR-NEXT: fsdp.aten "aten::t"
// SCALAR:      %[[T:.*]] = fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0] reduction = average reduce_dtype = f32 unit @root : tensor<f32> -> !fsdp.future<tensor<f32>>
// SCALAR:      %[[TW:.*]] = fsdp.wait %[[T]]
// SCALAR:      fsdp.reduce_scatter_start
// SCALAR:      fsdp.gradients [@w, @temp] %{{.*}}, %[[TW]] : tensor<2x4xf32>, tensor<f32>
// SCALAR-HSDP: fsdp.param @temp : tensor<f32> unit @root{{$}}
// SCALAR-HSDP: %[[T:.*]] = fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0, 1] reduction = average reduce_dtype = f32 unit @root : tensor<f32>
// SCALAR-HSDP: %[[TW:.*]] = fsdp.wait %[[T]]
// SCALAR-HSDP: fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0] {{.*}} : tensor<2x4xf32>
// SCALAR-HSDP: fsdp.gradients [@w, @temp] %{{.*}}, %[[TW]]
// SCALAR-GROUP: fsdp.param @temp : tensor<f32> unit @root{{$}}
// SCALAR-GROUP: fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0, 1] {{.*}} : tensor<f32>

// Every parameter is dim-0 sharded with its padding: l1.w has 4 rows, one per
// rank; head has 3, so the last rank holds none and the group pads 1.
// CHECK:      shard.grid @fsdp_grid(shape = 4)
// CHECK:      fsdp.param @l0.w : tensor<10x4xf32> unit @l0 sharded on @fsdp_grid axes = [0] padding = 2
// CHECK:      fsdp.param @l1.w : tensor<4x10xf32> unit @l1 sharded on @fsdp_grid axes = [0] padding = 0
// CHECK:      fsdp.param @head : tensor<3x4xf32> unit @root frozen sharded on @fsdp_grid axes = [0] padding = 1

// Reads become shard reads, each gathered where it was read.
// CHECK-LABEL: func.func @train_step
// CHECK:      %[[S:.*]] = fsdp.get_param @l0.w : tensor<3x4xf32>
// CHECK-NEXT: %[[F:.*]] = fsdp.all_gather_start %[[S]] on @fsdp_grid axes = [0] unit @l0 : tensor<3x4xf32> -> !fsdp.future<tensor<10x4xf32>>
// CHECK-NEXT: %[[W:.*]] = fsdp.wait %[[F]] : !fsdp.future<tensor<10x4xf32>>
// CHECK:      fsdp.aten "aten::addmm"(%{{.*}}, %arg0, %[[W]])

// Gradients are reduce-scattered right after their last producer; the frozen
// head has none.
// CHECK:      %[[GW1:.*]] = fsdp.aten "aten::mm"(%{{.*}}) module "l1" : (tensor<2x4xf32>, tensor<2x10xf32>) -> tensor<4x10xf32>
// CHECK-NEXT: %[[R:.*]] = fsdp.reduce_scatter_start %[[GW1]] on @fsdp_grid axes = [0] reduction = average reduce_dtype = f32 unit @l1 : tensor<4x10xf32> -> !fsdp.future<tensor<1x10xf32>>
// CHECK-NEXT: %[[GS:.*]] = fsdp.wait %[[R]]
// CHECK:      fsdp.gradients [@l0.w, @l0.b, @l1.w] %{{.*}}, %{{.*}}, %[[GS]] : tensor<3x4xf32>, tensor<3xf32>, tensor<1x10xf32>

// Hybrid: shard within a row of the 2x4 grid, then average across rows.
// HSDP:      shard.grid @fsdp_grid(shape = 2x4)
// HSDP:      fsdp.param @l0.w : tensor<10x4xf32> unit @l0 sharded on @fsdp_grid axes = [1] padding = 2
// HSDP:      fsdp.reduce_scatter_start %{{.*}} on @fsdp_grid axes = [1] reduction = average
// HSDP:      %[[AR:.*]] = fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0] reduction = average reduce_dtype = f32 unit @l0 : tensor<3x4xf32>
// HSDP:      fsdp.gradients

// A gradient divide factor (FSDP2's set_gradient_divide_factor): sums, and
// each gradient divided by the factor once, at its first reduction (1: not at all).
// SUMMED-COUNT-3: fsdp.reduce_scatter_start %{{.*}} on @fsdp_grid axes = [0] reduction = sum reduce_dtype = f32 unit @{{l[01]}} :
// SUMMED-NOT:     divide
// DIVIDE-HSDP: fsdp.reduce_scatter_start %{{.*}} on @fsdp_grid axes = [1] reduction = sum reduce_dtype = f32 post_divide = 2.500000e+00 unit @l0
// DIVIDE-HSDP: fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0] reduction = sum reduce_dtype = f32 unit @l0 : tensor<3x4xf32>
// DIVIDE-SCALAR: fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0] reduction = sum reduce_dtype = f32 post_divide = 1.600000e+01 unit @root : tensor<f32>
// DIVIDE-SCALAR: fsdp.reduce_scatter_start %{{.*}} reduction = sum reduce_dtype = f32 post_divide = 1.600000e+01 unit @root
// NEGATIVE: error: gradient-divide-factor must be positive and finite (0: average over the data-parallel ranks), got -2

// No-shard: whole parameters, gradients all-reduced (DDP).
// DDP:       shard.grid @fsdp_grid(shape = 8)
// DDP:       fsdp.param @l0.w : tensor<10x4xf32> unit @l0{{$}}
// DDP-NOT:   fsdp.all_gather_start
// DDP:       fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0] reduction = average reduce_dtype = f32 unit @l1 : tensor<4x10xf32>
// DDP:       fsdp.gradients [@l0.w, @l0.b, @l1.w] %{{.*}} : tensor<10x4xf32>, tensor<10xf32>, tensor<4x10xf32>

// A reshard group splits the shard axis: 8 ranks as 4 x 2.
// GROUP:     shard.grid @fsdp_grid(shape = 4x2)
// GROUP:     fsdp.param @l0.w : tensor<10x4xf32> unit @l0 sharded on @fsdp_grid axes = [0, 1] padding = 6

// Gradient accumulation: a no-sync microbatch step, and the synchronized step
// adds what accumulated before reducing.
// ACCUM-LABEL: func.func @train_step(
// ACCUM:       %[[ACC:.*]] = fsdp.get_accumulated_grad @l1.w : tensor<4x10xf32>
// ACCUM-NEXT:  %[[SUM:.*]] = fsdp.aten "aten::add.Tensor"(%{{.*}}, %[[ACC]]) args [0 : index, 1 : index, 1]
// ACCUM-NEXT:  fsdp.reduce_scatter_start %[[SUM]]
// ACCUM-LABEL: func.func @train_step_no_sync(
// ACCUM:       fsdp.all_gather_start
// ACCUM-NOT:   fsdp.reduce_scatter_start
// ACCUM:       fsdp.gradients [@l0.w, @l0.b, @l1.w] %{{.*}} unreduced : tensor<10x4xf32>, tensor<10xf32>, tensor<4x10xf32>

// fp16 gradients are summed with pre/post division, as FSDP2 does.
// With a divide factor the same split applies to the factor.
// HALF-DIVIDE-LABEL: func.func @half
// HALF-DIVIDE: fsdp.reduce_scatter_start %arg1 on @fsdp_grid axes = [0] reduction = sum reduce_dtype = f16 pre_divide = 8.000000e+00 post_divide = 8.000000e+00 unit @root
// HALF-LABEL: func.func @half
// HALF: fsdp.reduce_scatter_start %arg1 on @fsdp_grid axes = [0] reduction = sum reduce_dtype = f16 pre_divide = 2.000000e+00 post_divide = 2.000000e+00 unit @root : tensor<8xf16> -> !fsdp.future<tensor<2xf16>>

fsdp.unit @root root
fsdp.param @w : tensor<8xf16> unit @root
func.func @half(%l: tensor<f32>, %g: tensor<8xf16>) -> tensor<f32> {
  %w = fsdp.get_param @w : tensor<8xf16>
  fsdp.loss %l : tensor<f32>
  fsdp.gradients [@w] %g : tensor<8xf16>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{already has @fsdp_grid; it is sharded already}}
module {
  shard.grid @fsdp_grid(shape = 4)
  func.func @f(%l: tensor<f32>) {
    fsdp.loss %l : tensor<f32>
    return
  }
}

// -----

// expected-error @+1 {{no training step (a function with fsdp.loss) to shard}}
module {
  func.func @f() {
    return
  }
}

// A sum over ranks in the step becomes a summing all-reduce over the whole
// grid, where it was, forward and backward; with accumulation the no-sync
// microbatch step sums too (its statistics span the ranks as well).
// SYNCED: %[[F:.*]] = fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0] reduction = sum reduce_dtype = f32 : tensor<6xf32> -> !fsdp.future<tensor<6xf32>>
// SYNCED-NEXT: %[[T:.*]] = fsdp.wait %[[F]]
// SYNCED-NEXT: fsdp.aten "aten::sum"(%[[T]])
// SYNCED: fsdp.loss
// SYNCED: %[[G:.*]] = fsdp.aten "aten::ones"
// SYNCED-NEXT: %[[GF:.*]] = fsdp.all_reduce_start %[[G]] on @fsdp_grid axes = [0] reduction = sum reduce_dtype = f32 : tensor<6xf32>
// SYNCED-NEXT: %[[GT:.*]] = fsdp.wait %[[GF]]
// SYNCED-NEXT: fsdp.aten "aten::expand"(%[[GT]])
// SYNCED-NOT: fsdp.data_parallel_sum
// SYNCED-HSDP-LABEL: func.func @train_step(
// SYNCED-HSDP-COUNT-2: fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0, 1] reduction = sum reduce_dtype = f32 : tensor<6xf32>
// SYNCED-HSDP-LABEL: func.func @train_step_no_sync(
// SYNCED-HSDP-COUNT-2: fsdp.all_reduce_start %{{.*}} on @fsdp_grid axes = [0, 1] reduction = sum reduce_dtype = f32 : tensor<6xf32>
// SYNCED-HSDP-NOT: fsdp.data_parallel_sum
