// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward --fsdp-verify-schedule | FileCheck %s
// RUN: fsdp-opt %s -split-input-file -verify-diagnostics --fsdp-verify-schedule

// The hash is stable (same input, same hash) and changes with what travels
// (8 ranks instead of 4).
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward --fsdp-verify-schedule | grep -o 'collective_hash = "[0-9a-f]*"' > %t.first
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward --fsdp-verify-schedule | grep -o 'collective_hash = "[0-9a-f]*"' > %t.again
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=8" --fsdp-reshard-after-forward --fsdp-verify-schedule | grep -o 'collective_hash = "[0-9a-f]*"' > %t.other
// RUN: cmp %t.first %t.again
// RUN: not cmp %t.first %t.other

// CHECK: func.func @train_step(%arg0: tensor<2x4xf32>) -> tensor<f32> attributes {fsdp.collective_count = 8 : i64, fsdp.collective_hash = "{{[0-9a-f]+}}"}

shard.grid @fsdp_grid(shape = 2)
fsdp.unit @root root
fsdp.param @w : tensor<2xf32> unit @root sharded on @fsdp_grid axes = [0] padding = 0
func.func @branchy(%l: tensor<f32>, %c: i1) -> tensor<f32> {
  fsdp.loss %l : tensor<f32>
  scf.if %c {
    %s = fsdp.get_param @w : tensor<1xf32>
    // expected-error @+1 {{is under control flow; every rank must issue the same collectives}}
    %f = fsdp.all_gather_start %s on @fsdp_grid axes = [0] : tensor<1xf32> -> !fsdp.future<tensor<2xf32>>
    %w = fsdp.wait %f : !fsdp.future<tensor<2xf32>>
    fsdp.reshard %w : tensor<2xf32>
  }
  return %l : tensor<f32>
}

// -----

shard.grid @fsdp_grid(shape = 2)
fsdp.unit @root root
fsdp.param @w : tensor<2xf32> unit @root sharded on @fsdp_grid axes = [0] padding = 0
func.func @leaky(%l: tensor<f32>) -> tensor<2xf32> {
  %s = fsdp.get_param @w : tensor<1xf32>
  // expected-error @+1 {{gathers a buffer that is never freed}}
  %f = fsdp.all_gather_start %s on @fsdp_grid axes = [0] : tensor<1xf32> -> !fsdp.future<tensor<2xf32>>
  %w = fsdp.wait %f : !fsdp.future<tensor<2xf32>>
  fsdp.loss %l : tensor<f32>
  return %w : tensor<2xf32>
}
