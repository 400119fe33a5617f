// RUN: fsdp-opt %s -split-input-file -allow-unregistered-dialect -verify-diagnostics

// Rules about nesting, checked with an unregistered region-holding op
// ("test.region") since the registered dialects have no such op whose
// regions can use outer values.

// A use inside a nested region counts at its enclosing op: here before the
// free, so this is valid.
shard.grid @dp(shape = 4)
func.func @use_in_region_before_free(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  "test.region"() ({
    %y = fsdp.aten "aten::relu" (%g) : (tensor<12xf32>) -> tensor<12xf32>
    "test.terminator"() : () -> ()
  }) : () -> ()
  fsdp.reshard %g : tensor<12xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.reshard' op frees buffer 0 before its last use}}
  fsdp.reshard %g : tensor<12xf32>
  "test.region"() ({
    // expected-note @+1 {{used after the free here}}
    %y = fsdp.aten "aten::relu" (%g) : (tensor<12xf32>) -> tensor<12xf32>
    "test.terminator"() : () -> ()
  }) : () -> ()
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-note @+1 {{used here}}
  %y = fsdp.aten "aten::relu" (%g) : (tensor<12xf32>) -> tensor<12xf32>
  "test.region"() ({
    // expected-error @+1 {{'fsdp.reshard' op frees buffer 0, which is used outside the block that frees it}}
    fsdp.reshard %g : tensor<12xf32>
    "test.terminator"() : () -> ()
  }) : () -> ()
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op must be waited for in the block that starts it}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  "test.region"() ({
    %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
    "test.terminator"() : () -> ()
  }) : () -> ()
  return
}

// -----

func.func @f(%l: tensor<f32>) {
  "test.region"() ({
    // expected-error @+1 {{'fsdp.loss' op must sit directly in a function body}}
    fsdp.loss %l : tensor<f32>
    "test.terminator"() : () -> ()
  }) : () -> ()
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  fsdp.loss %l : tensor<f32>
  "test.region"() ({
    // expected-error @+1 {{'fsdp.gradients' op must sit directly in a function body}}
    fsdp.gradients [@a] %g : tensor<4xf32>
    "test.terminator"() : () -> ()
  }) : () -> ()
  return
}
