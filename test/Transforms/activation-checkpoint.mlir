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
