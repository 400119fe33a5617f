// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-activation-checkpoint="units=l0" | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-activation-checkpoint="units=*" | FileCheck %s --check-prefix=ALL
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-activation-checkpoint="units=nosuch" 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-activation-checkpoint="units=root" 2>&1 | FileCheck %s --check-prefix=ROOT

// l0's activation is recomputed from the unit's input right before backward
// first reads it; the forward copy dies at the end of forward.
// CHECK:      %[[H:.*]] = fsdp.aten "aten::addmm"(%[[B:.*]], %arg0, %[[W:.*]]) module "l0"
// CHECK-NEXT: %[[A:.*]] = fsdp.aten "aten::relu"(%[[H]]) module "l0"
// CHECK:      fsdp.loss
// CHECK:      %[[H2:.*]] = fsdp.aten "aten::addmm"(%[[B]], %arg0, %[[W]]) module "l0" {fsdp.recomputed}
// CHECK-NEXT: %[[A2:.*]] = fsdp.aten "aten::relu"(%[[H2]]) module "l0" {fsdp.recomputed}
// CHECK-NEXT: fsdp.aten "aten::mm"(%{{.*}}, %[[A2]]) module "l1"
// CHECK:      fsdp.aten "aten::threshold_backward"(%{{.*}}, %[[A2]])
// CHECK-NOT:  %[[A]]

// With `*`, l1's view of its weight is recomputed too; the root is not.
// ALL:      fsdp.loss
// ALL-NEXT: fsdp.aten "aten::ones"
// ALL-NEXT: fsdp.aten "aten::mm"(%{{.*}}) module ""
// ALL-NEXT: fsdp.aten "aten::t"(%{{.*}}) module "l1"

// UNKNOWN: error: activation checkpointing names unknown unit 'nosuch'
// ROOT: step.mlir:4:1: error: activation checkpointing cannot recompute the root unit: it holds the loss; name the units inside it

// Random operators are saved, not recomputed, so the mask stays the same.
fsdp.unit @root root
fsdp.unit @l0
func.func @dropout(%x: tensor<4xf32>) -> tensor<f32> {
  %d = fsdp.aten "aten::bernoulli" (%x) random module "l0" : (tensor<4xf32>) -> tensor<4xf32>
  %m = fsdp.aten "aten::mul.Tensor" (%x, %d) module "l0" : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %l = fsdp.aten "aten::sum" (%m) module "" : (tensor<4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %g = fsdp.aten "aten::mul.Tensor" (%m, %d) module "l0" : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %l : tensor<f32>
}
// RUN: fsdp-opt %s --fsdp-activation-checkpoint="units=l0" | FileCheck %s --check-prefix=RANDOM
// RANDOM-LABEL: func.func @dropout
// RANDOM:       %[[D:.*]] = fsdp.aten "aten::bernoulli"(%arg0) random module "l0"
// RANDOM:       fsdp.loss
// RANDOM-NEXT:  %[[M:.*]] = fsdp.aten "aten::mul.Tensor"(%arg0, %[[D]]) module "l0"
// RANDOM-NEXT:  fsdp.aten "aten::mul.Tensor"(%[[M]], %[[D]])
// RANDOM-NOT:   aten::bernoulli

// policy=ops saves the first and third matrix product (an addmm, a linear
// with a bias, counts) and recomputes the rest from them: relu from the
// first, the second mm from relu.
func.func @ops(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>, %b: tensor<4xf32>) -> tensor<f32> {
  %m1 = fsdp.aten "aten::mm" (%x, %w) module "l0" : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %r1 = fsdp.aten "aten::relu" (%m1) module "l0" : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %m2 = fsdp.aten "aten::mm" (%r1, %w) module "l0" : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %m3 = fsdp.aten "aten::addmm" (%b, %m2, %w) module "l0" : (tensor<4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %l = fsdp.aten "aten::sum" (%m3) module "" : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %g1 = fsdp.aten "aten::mul.Tensor" (%r1, %m2) module "l0" : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %g2 = fsdp.aten "aten::mul.Tensor" (%m1, %m3) module "l0" : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %l : tensor<f32>
}
// RUN: fsdp-opt %s --fsdp-activation-checkpoint="units=l0 policy=ops" | FileCheck %s --check-prefix=OPS
// OPS-LABEL: func.func @ops
// OPS:       %[[M1:.*]] = fsdp.aten "aten::mm"(%arg0, %arg1) module "l0"
// OPS-NEXT:  fsdp.aten "aten::relu"
// OPS-NEXT:  fsdp.aten "aten::mm"
// OPS-NEXT:  %[[M3:.*]] = fsdp.aten "aten::addmm"
// OPS:       fsdp.loss
// OPS-NEXT:  %[[R:.*]] = fsdp.aten "aten::relu"(%[[M1]]) module "l0" {fsdp.recomputed}
// OPS-NEXT:  %[[M2:.*]] = fsdp.aten "aten::mm"(%[[R]], %arg1) module "l0" {fsdp.recomputed}
// OPS-NOT:   recomputed
// OPS-NEXT:  fsdp.aten "aten::mul.Tensor"(%[[R]], %[[M2]])
// OPS-NEXT:  fsdp.aten "aten::mul.Tensor"(%[[M1]], %[[M3]])
// The full policy recomputes all three products.
// RUN: fsdp-opt %s --fsdp-activation-checkpoint="units=l0" | FileCheck %s --check-prefix=FULL
// FULL-LABEL: func.func @ops
// FULL:       fsdp.loss
// FULL-COUNT-3: fsdp.aten "aten::{{(add)?}}mm"{{.*}} {fsdp.recomputed}
// RUN: not fsdp-opt %s --fsdp-activation-checkpoint="units=l0 policy=half" 2>&1 | FileCheck %s --check-prefix=POLICY
// POLICY: error: activation checkpointing: unknown policy 'half'; use full or ops
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 checkpoint-policy=ops" 2>&1 | FileCheck %s --check-prefix=NOUNITS
// NOUNITS: error: activation checkpointing: policy 'ops' applies to the units it recomputes and to the model's checkpoint regions; no unit is named (checkpoint=...) and the model checkpoints nothing
// RUN: not fsdp-opt %S/Inputs/backward-in-region.mlir --fsdp-activation-checkpoint 2>&1 | FileCheck %s --check-prefix=BACKWARD
// BACKWARD: backward-in-region.mlir:6:8: error: 'fsdp.aten' op is a backward call marked as in checkpoint region 0; regions mark the forward calls that backward recomputes

// The model's own checkpoint regions, with no unit named: region 0 (l0's
// mm and relu) is recomputed from %x and %w right before backward first
// reads it, region 1 (l1's relu alone) from l1's mm, which stays saved.
// The clones are in no region.
func.func @regions(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<f32> {
  %m1 = fsdp.aten "aten::mm" (%x, %w) module "l0" checkpoint 0 : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %r1 = fsdp.aten "aten::relu" (%m1) module "l0" checkpoint 0 : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %m2 = fsdp.aten "aten::mm" (%r1, %w) module "l1" : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %r2 = fsdp.aten "aten::relu" (%m2) module "l1" checkpoint 1 : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %l = fsdp.aten "aten::sum" (%r2) module "" : (tensor<4x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %g1 = fsdp.aten "aten::mul.Tensor" (%m2, %r2) module "l1" : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %g2 = fsdp.aten "aten::mul.Tensor" (%g1, %r1) module "l0" : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %l : tensor<f32>
}
// RUN: fsdp-opt %s --fsdp-activation-checkpoint | FileCheck %s --check-prefix=REGIONS
// REGIONS-LABEL: func.func @regions
// REGIONS:       %[[M2:.*]] = fsdp.aten "aten::mm"(%{{.*}}, %arg1) module "l1" :
// REGIONS:       fsdp.loss
// REGIONS-NEXT:  %[[R2:.*]] = fsdp.aten "aten::relu"(%[[M2]]) module "l1" {fsdp.recomputed}
// REGIONS-NEXT:  %[[G1:.*]] = fsdp.aten "aten::mul.Tensor"(%[[M2]], %[[R2]])
// REGIONS-NEXT:  %[[M1:.*]] = fsdp.aten "aten::mm"(%arg0, %arg1) module "l0" {fsdp.recomputed}
// REGIONS-NEXT:  %[[R1:.*]] = fsdp.aten "aten::relu"(%[[M1]]) module "l0" {fsdp.recomputed}
// REGIONS-NEXT:  fsdp.aten "aten::mul.Tensor"(%[[G1]], %[[R1]])
// A unit named as well (l0) recomputes region 0 as part of itself, once.
// RUN: fsdp-opt %s --fsdp-activation-checkpoint="units=l0" | FileCheck %s --check-prefix=UNITANDREGION
// UNITANDREGION-LABEL: func.func @regions
// UNITANDREGION:       fsdp.loss
// UNITANDREGION-COUNT-1: fsdp.aten "aten::mm"{{.*}} {fsdp.recomputed}
// UNITANDREGION-NOT:   fsdp.aten "aten::mm"{{.*}} {fsdp.recomputed}
// UNITANDREGION:       return
