// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward="mode=false" | FileCheck %s --check-prefix=KEEP
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward="root=true" | FileCheck %s --check-prefix=ROOT
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=8 reshard-group=2" --fsdp-reshard-after-forward="mode=2" | FileCheck %s --check-prefix=GROUP
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=8" --fsdp-reshard-after-forward="mode=2" 2>&1 | FileCheck %s --check-prefix=NOGROUP
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-reshard-after-forward="mode=sometimes" 2>&1 | FileCheck %s --check-prefix=BADMODE

// l1's weight is read in backward through the view `t` made in forward: it is
// freed after forward, gathered again after the loss, and the view is re-made
// from the new buffer. l0's buffers, unused in backward, are freed once.
// CHECK:      %[[W1:.*]] = fsdp.wait %{{.*}} : !fsdp.future<tensor<4x10xf32>>
// CHECK-NEXT: %[[T:.*]] = fsdp.aten "aten::t"(%[[W1]]) module "l1"
// CHECK-NEXT: %[[Y:.*]] = fsdp.aten "aten::mm"(%{{.*}}, %[[T]]) module "l1"
// CHECK-NEXT: fsdp.reshard %[[W1]] : tensor<4x10xf32>
// CHECK:      fsdp.loss
// The root keeps its (frozen) head until backward is done with it.
// CHECK:      fsdp.aten "aten::mm"(%{{.*}}, %[[HEAD:.*]]) module ""
// CHECK-NEXT: fsdp.reshard %[[HEAD]] : tensor<3x4xf32>
// CHECK-NEXT: %[[S:.*]] = fsdp.get_param @l1.w : tensor<1x10xf32>
// CHECK-NEXT: %[[F:.*]] = fsdp.all_gather_start %[[S]] on @fsdp_grid axes = [0] unit @l1
// CHECK-NEXT: %[[W1B:.*]] = fsdp.wait %[[F]]
// CHECK-NEXT: %[[TB:.*]] = fsdp.aten "aten::t"(%[[W1B]]) module "l1"
// CHECK-NEXT: fsdp.aten "aten::mm"(%{{.*}}, %[[TB]]) module "l1"
// CHECK-NEXT: fsdp.reshard %[[W1B]] : tensor<4x10xf32>

// SHARD_GRAD_OP: gathered once, freed after backward's last use.
// KEEP:      fsdp.loss
// KEEP-NOT:  fsdp.all_gather_start
// KEEP:      fsdp.aten "aten::mm"(%{{.*}}, %[[T:.*]]) module "l1"
// KEEP-NEXT: fsdp.reshard

// root=true reshards the root's head as well.
// ROOT:      fsdp.loss
// ROOT:      fsdp.get_param @head : tensor<1x4xf32>
// ROOT-NEXT: fsdp.all_gather_start %{{.*}} unit @root

// mode=2 keeps l1's weight sharded over the inner 2 ranks between forward and
// backward, and gathers it back within them.
// GROUP:      %[[KEPT:.*]] = fsdp.all_slice %{{.*}} on @fsdp_grid axes = [1] : tensor<4x10xf32> -> tensor<2x10xf32>
// GROUP-NEXT: fsdp.reshard
// GROUP:      fsdp.loss
// GROUP:      fsdp.all_gather_start %[[KEPT]] on @fsdp_grid axes = [1] unit @l1 : tensor<2x10xf32> -> !fsdp.future<tensor<4x10xf32>>

// NOGROUP: error: 'fsdp.all_gather_start' op reshard-after-forward=2 needs parameters sharded with reshard-group=2 (fsdp-shard-parameters)
// BADMODE: error: reshard-after-forward mode must be true, false or a positive integer, got 'sometimes'
