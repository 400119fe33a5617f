// RUN: not fsdp-translate --fsdp-to-program %s -split-input-file 2>&1 | FileCheck %s

// Element types outside fsdp_rt/ElementTypes.h never reach a program.
// CHECK: error: 'fsdp.aten' op fsdp-to-program: element type 'f80' has no runtime equivalent (fsdp_rt/ElementTypes.h)
func.func @f80() -> tensor<4xf80> {
  %y = fsdp.aten "aten::zeros" () args [[4], f80] : () -> tensor<4xf80>
  return %y : tensor<4xf80>
}

// -----

// CHECK: error: 'fsdp.param' op fsdp-to-program: element type 'f80' has no runtime equivalent
fsdp.unit @root root
fsdp.param @w : tensor<4xf80> unit @root
