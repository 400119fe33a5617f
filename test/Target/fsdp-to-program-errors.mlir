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

// -----

// A kernel's loop is laid out from its inputs' strides: an input made by an
// operator whose result's strides no rule states cannot be read by one.
// CHECK: error: 'fsdp.pointwise' op fsdp-to-program: the strides of this kernel's inputs are not known, so its loop cannot be laid out
module attributes {fsdp.device = "cuda"} {
func.func @unknown_layout(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %s = fsdp.aten "aten::sort"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = fsdp.pointwise (%s) : (tensor<4x8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>):
    %e = fsdp.aten "aten::exp"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    fsdp.yield %e : tensor<4x8xf32>
  }
  return %y : tensor<4x8xf32>
}
}
