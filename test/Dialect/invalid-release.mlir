// RUN: fsdp-opt %s -split-input-file -verify-diagnostics

// Negative tests for fsdp.release. Errors about a later use of the value
// come with a note at that use.

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.release' op releases nothing; it needs at least one value}}
  "fsdp.release"() : () -> ()
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.release' op lists value 1 twice}}
  fsdp.release %x, %x : tensor<4xf32>, tensor<4xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.release' op value 0 is a gathered buffer; fsdp.reshard frees gathered buffers}}
  fsdp.release %g : tensor<12xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'fsdp.release' op releases value 0 before its last use}}
  fsdp.release %x : tensor<4xf32>
  // expected-note @+1 {{used after the release here}}
  %y = fsdp.aten "aten::relu" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.release' op value 0 is released again later}}
  fsdp.release %x : tensor<4xf32>
  // expected-note @+1 {{used after the release here}}
  fsdp.release %x : tensor<4xf32>
  return
}

// -----

// A use inside a nested region counts at its enclosing op.
func.func @f(%x: tensor<4xf32>, %c: i1) {
  // expected-error @+1 {{'fsdp.release' op releases value 0 before its last use}}
  fsdp.release %x : tensor<4xf32>
  scf.if %c {
    // expected-note @+1 {{used after the release here}}
    %y = fsdp.aten "aten::relu" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  }
  return
}

// -----

func.func @f(%x: tensor<4xf32>, %c: i1) {
  scf.if %c {
    // expected-error @+1 {{'fsdp.release' op releases value 0, which is used outside the block that releases it}}
    fsdp.release %x : tensor<4xf32>
  }
  // expected-note @+1 {{used here}}
  %y = fsdp.aten "aten::relu" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

// expected-error @+1 {{'fsdp.release' op must be inside a function (a training step)}}
"fsdp.release"() : () -> ()
