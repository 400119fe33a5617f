// RUN: fsdp-opt %s -split-input-file -verify-diagnostics

// Negative tests for fsdp.reshard. Errors about a later use of the buffer
// come with a note at that use.

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.reshard' op lists buffer 1 twice}}
  fsdp.reshard %g, %g : tensor<12xf32>, tensor<12xf32>
  return
}

// -----

func.func @f(%x: tensor<12xf32>) {
  // expected-error @+1 {{'fsdp.reshard' op operand 0 is not a gathered buffer (a result of fsdp.wait on fsdp.all_gather_start)}}
  fsdp.reshard %x : tensor<12xf32>
  return
}

// -----

func.func @f(%x: tensor<12xf32>) {
  %y = fsdp.aten "aten::relu" (%x) : (tensor<12xf32>) -> tensor<12xf32>
  // expected-error @+1 {{'fsdp.reshard' op operand 0 is not a gathered buffer (a result of fsdp.wait on fsdp.all_gather_start)}}
  fsdp.reshard %y : tensor<12xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>, %g: tensor<12xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %a = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  %r = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<12xf32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %r : !fsdp.future<tensor<3xf32>>
  // The wait of a reduce-scatter yields no gathered buffer.
  // expected-error @+1 {{'fsdp.reshard' op operand 1 is not a gathered buffer (a result of fsdp.wait on fsdp.all_gather_start)}}
  fsdp.reshard %a, %s : tensor<12xf32>, tensor<3xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  %c = fsdp.cast %g : tensor<12xf32> to tensor<12xbf16>
  // A cast of a gathered buffer is not the buffer.
  // expected-error @+1 {{'fsdp.reshard' op operand 0 is not a gathered buffer (a result of fsdp.wait on fsdp.all_gather_start)}}
  fsdp.reshard %c : tensor<12xbf16>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) -> tensor<12xf32> {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.reshard' op frees buffer 0, which is used outside the block that frees it}}
  fsdp.reshard %g : tensor<12xf32>
  return %g : tensor<12xf32>
^unreachable:
  // expected-note @+1 {{used here}}
  %y = fsdp.aten "aten::relu" (%g) : (tensor<12xf32>) -> tensor<12xf32>
  return %y : tensor<12xf32>
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-note @+1 {{used here}}
  %y = fsdp.aten "aten::relu" (%g) : (tensor<12xf32>) -> tensor<12xf32>
  return
^unreachable:
  // The free is in another block than a use of the buffer.
  // expected-error @+1 {{'fsdp.reshard' op frees buffer 0, which is used outside the block that frees it}}
  fsdp.reshard %g : tensor<12xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>, %b: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w, %b on @dp axes = [0] : tensor<3xf32>, tensor<3xf32> -> !fsdp.future<tensor<12xf32>, tensor<12xf32>>
  %g:2 = fsdp.wait %f : !fsdp.future<tensor<12xf32>, tensor<12xf32>>
  // expected-error @+1 {{'fsdp.reshard' op buffer 1 is freed again later}}
  fsdp.reshard %g#0, %g#1 : tensor<12xf32>, tensor<12xf32>
  // expected-note @+1 {{used after the free here}}
  fsdp.reshard %g#1 : tensor<12xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>, %x: tensor<12xf32>) -> tensor<12xf32> {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.reshard' op frees buffer 0 before its last use}}
  fsdp.reshard %g : tensor<12xf32>
  // expected-note @+1 {{used after the free here}}
  %y = fsdp.aten "aten::add.Tensor" (%x, %g) : (tensor<12xf32>, tensor<12xf32>) -> tensor<12xf32>
  return %y : tensor<12xf32>
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) -> tensor<12xf32> {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.reshard' op frees buffer 0 before its last use}}
  fsdp.reshard %g : tensor<12xf32>
  // Returning the buffer is a use too.
  // expected-note @+1 {{used after the free here}}
  return %g : tensor<12xf32>
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.reshard' op frees buffer 0 before its last use}}
  fsdp.reshard %g : tensor<12xf32>
  // A collective started after the free reads freed memory.
  // expected-note @+1 {{used after the free here}}
  %r = fsdp.all_reduce_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<12xf32> -> !fsdp.future<tensor<12xf32>>
  %s = fsdp.wait %r : !fsdp.future<tensor<12xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) -> tensor<12xf32> {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  %r = fsdp.all_reduce_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<12xf32> -> !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.reshard' op frees buffer 0 while a collective reading it is in flight}}
  fsdp.reshard %g : tensor<12xf32>
  // expected-note @+1 {{the collective is waited for here}}
  %s = fsdp.wait %r : !fsdp.future<tensor<12xf32>>
  return %s : tensor<12xf32>
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>, %v: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w, %v on @dp axes = [0] : tensor<3xf32>, tensor<3xf32> -> !fsdp.future<tensor<12xf32>, tensor<12xf32>>
  %g:2 = fsdp.wait %f : !fsdp.future<tensor<12xf32>, tensor<12xf32>>
  %r = fsdp.reduce_scatter_start %g#1 on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<12xf32> -> !fsdp.future<tensor<3xf32>>
  // expected-error @+1 {{'fsdp.reshard' op frees buffer 1 while a collective reading it is in flight}}
  fsdp.reshard %g#0, %g#1 : tensor<12xf32>, tensor<12xf32>
  // expected-note @+1 {{the collective is waited for here}}
  %s = fsdp.wait %r : !fsdp.future<tensor<3xf32>>
  return
}

// -----

func.func @f(%x: tensor<*xf32>) {
  // expected-error @+1 {{'fsdp.reshard' op operand #0 must be variadic of ranked tensor of any type values, but got 'tensor<*xf32>'}}
  "fsdp.reshard"(%x) : (tensor<*xf32>) -> ()
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'fsdp.reshard' op frees nothing; it needs at least one gathered buffer}}
  "fsdp.reshard"() : () -> ()
  return
}
