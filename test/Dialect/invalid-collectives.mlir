// RUN: fsdp-opt %s -split-input-file -verify-diagnostics

// Negative tests for fsdp.all_gather_start, fsdp.reduce_scatter_start,
// fsdp.all_reduce_start, fsdp.wait, fsdp.all_slice and fsdp.data_parallel_sum.

//===----------------------------------------------------------------------===//
// Bucket and future pairing (shown on all three collectives)
//===----------------------------------------------------------------------===//

shard.grid @dp(shape = 4)
func.func @f() {
  // The custom syntax cannot spell an empty bucket; the generic one can.
  // expected-error @+1 {{'fsdp.all_gather_start' op needs at least one tensor in its bucket}}
  %f = "fsdp.all_gather_start"() <{grid = @dp, grid_axes = array<i16: 0>}> : () -> !fsdp.future<tensor<4xf32>>
  %w = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f() {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op needs at least one tensor in its bucket}}
  %f = "fsdp.reduce_scatter_start"() <{grid = @dp, grid_axes = array<i16: 0>, reduction = #shard<partial sum>, reduce_dtype = f32}> : () -> !fsdp.future<tensor<1xf32>>
  %w = fsdp.wait %f : !fsdp.future<tensor<1xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3x32xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op future carries 2 results for 1 input}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3x32xf32> -> !fsdp.future<tensor<10x32xf32>, tensor<10xf32>>
  %a, %b = fsdp.wait %f : !fsdp.future<tensor<10x32xf32>, tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op future carries 1 result for 2 inputs}}
  %f = fsdp.all_reduce_start %g, %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<10xf32>, tensor<10xf32> -> !fsdp.future<tensor<10xf32>>
  %a = fsdp.wait %f : !fsdp.future<tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op is never waited for: its future needs an fsdp.wait}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<12xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op future is used more than once; it takes exactly one fsdp.wait}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 : tensor<12xf32> -> !fsdp.future<tensor<3xf32>>
  %a = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  %b = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) -> !fsdp.future<tensor<12xf32>> {
  // expected-error @+1 {{'fsdp.all_gather_start' op future must be consumed by fsdp.wait, not func.return}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  return %f : !fsdp.future<tensor<12xf32>>
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op future must be consumed by fsdp.wait, not fsdp.aten}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = max reduce_dtype = f32 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  fsdp.aten "c10d::wait_tensor" (%f) : (!fsdp.future<tensor<4xf32>>) -> ()
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op must be waited for in the block that starts it}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  return
^unreachable:
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.all_gather_start
//===----------------------------------------------------------------------===//

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<f32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op input 0: dim-0 sharding needs rank >= 1}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<f32> -> !fsdp.future<tensor<f32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<f32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3x32xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op input 1: ranks differ ('tensor<10x1xf32>' vs 'tensor<3xf32>')}}
  %f = fsdp.all_gather_start %w, %b on @dp axes = [0] : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xf32>, tensor<10x1xf32>>
  %g:2 = fsdp.wait %f : !fsdp.future<tensor<10x32xf32>, tensor<10x1xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3x32x4xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op input 0: dim 2 differs ('tensor<10x32x8xf32>' vs 'tensor<3x32x4xf32>')}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3x32x4xf32> -> !fsdp.future<tensor<10x32x8xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10x32x8xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3x32xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op result 1 has element type 'f32', but the bucket gathers in 'bf16'; a bucket has one communication dtype}}
  %f = fsdp.all_gather_start %w, %b on @dp axes = [0] : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xf32>>
  %g:2 = fsdp.wait %f : !fsdp.future<tensor<10x32xbf16>, tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xi32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op input 0 ('i32') cannot be cast to 'f32' in copy-in; only float-to-float casts are fused}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xi32> -> !fsdp.future<tensor<10xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op input 0 ('f32') cannot be cast to 'i8' in copy-in; only float-to-float casts are fused}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<10xi8>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10xi8>>
  return
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op prefetch depth must be >= 1, got 0}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] unit @root prefetch 0 : tensor<3xf32> -> !fsdp.future<tensor<10xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op prefetch needs the unit it prefetches for}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] prefetch 1 : tensor<3xf32> -> !fsdp.future<tensor<10xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op @nope does not name an fsdp.unit}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] unit @nope : tensor<3xf32> -> !fsdp.future<tensor<10xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10xf32>>
  return
}

// -----

fsdp.unit @root root
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op @dp does not name a shard.grid}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] unit @root : tensor<3xf32> -> !fsdp.future<tensor<10xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op grid axis 1 is out of range for @dp of rank 1}}
  %f = fsdp.all_gather_start %w on @dp axes = [1] : tensor<3xf32> -> !fsdp.future<tensor<10xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<2xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op input 0: a shard of 10 rows over 4 ranks has 3 rows (ceil(10/4)), not 2}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<2xf32> -> !fsdp.future<tensor<10xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>, %v: tensor<2xf32>) {
  // The second input of the bucket is the wrong size.
  // expected-error @+1 {{'fsdp.all_gather_start' op input 1: a shard of 10 rows over 4 ranks has 3 rows (ceil(10/4)), not 2}}
  %f = fsdp.all_gather_start %w, %v on @dp axes = [0] : tensor<3xf32>, tensor<2xf32> -> !fsdp.future<tensor<12xf32>, tensor<10xf32>>
  %g:2 = fsdp.wait %f : !fsdp.future<tensor<12xf32>, tensor<10xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<1xi8>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op input 0: cannot shard 9223372036854775807 rows over 4 ranks}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<1xi8> -> !fsdp.future<tensor<9223372036854775807xi8>>
  %g = fsdp.wait %f : !fsdp.future<tensor<9223372036854775807xi8>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<?xf32>) {
  // expected-error @+1 {{'fsdp.all_gather_start' op operand #0 must be variadic of statically shaped tensor, but got 'tensor<?xf32>'}}
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<?xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.reduce_scatter_start
//===----------------------------------------------------------------------===//

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<f32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op input 0: dim-0 sharding needs rank >= 1}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<f32> -> !fsdp.future<tensor<f32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<f32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op input 0: ranks differ ('tensor<10x32xf32>' vs 'tensor<96xf32>')}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<10x32xf32> -> !fsdp.future<tensor<96xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<96xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op input 0: dim 1 differs ('tensor<10x32xf32>' vs 'tensor<3x8xf32>')}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<10x32xf32> -> !fsdp.future<tensor<3x8xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3x8xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xi32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op input 0 has element type 'i32'; reductions need floating point}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<10xi32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf32>, %h: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op result 1 has element type 'i64'; reductions need floating point}}
  %f = fsdp.reduce_scatter_start %g, %h on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<10xf32>, tensor<10xf32> -> !fsdp.future<tensor<3xf32>, tensor<3xi64>>
  %s:2 = fsdp.wait %f : !fsdp.future<tensor<3xf32>, tensor<3xi64>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op reduce_dtype must be a floating-point type, got 'i32'}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = i32 : tensor<10xf32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op reduce_dtype must be a floating-point type, got 'tensor<4xf32>'}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = tensor<4xf32> : tensor<10xf32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op reduction max is not supported here; use sum or average}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = max reduce_dtype = f32 : tensor<10xf32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf16>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op average in f16 can overflow; use reduction sum with pre_divide and post_divide}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f16 : tensor<10xf16> -> !fsdp.future<tensor<3xf16>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf16>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op pre_divide applies only to reduction sum}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 pre_divide = 2.0 : tensor<10xf32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op post_divide applies only to reduction sum}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 post_divide = 2.0 : tensor<10xf32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf16>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op pre_divide must be positive and finite}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f16 pre_divide = 0.0 post_divide = 4.0 : tensor<10xf16> -> !fsdp.future<tensor<3xf16>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf16>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf16>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op post_divide must be positive and finite}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f16 pre_divide = 2.0 post_divide = -2.0 : tensor<10xf16> -> !fsdp.future<tensor<3xf16>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf16>>
  return
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op @nope does not name an fsdp.unit}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 unit @nope : tensor<10xf32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @hsdp(shape = 2x4)
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op grid axis 0 is listed twice}}
  %f = fsdp.reduce_scatter_start %g on @hsdp axes = [0, 0] reduction = sum reduce_dtype = f32 : tensor<10xf32> -> !fsdp.future<tensor<3xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<3xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<10xf32>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op result 0: a shard of 10 rows over 4 ranks has 3 rows (ceil(10/4)), not 5}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<10xf32> -> !fsdp.future<tensor<5xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<5xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<9223372036854775807xf16>) {
  // expected-error @+1 {{'fsdp.reduce_scatter_start' op result 0: cannot shard 9223372036854775807 rows over 4 ranks}}
  %f = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<9223372036854775807xf16> -> !fsdp.future<tensor<1xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<1xf32>>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.all_reduce_start
//===----------------------------------------------------------------------===//

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<3x32xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op result 0 has shape 'tensor<12x32xf32>', but an all-reduce keeps the input's shape 'tensor<3x32xf32>'}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 : tensor<3x32xf32> -> !fsdp.future<tensor<12x32xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<12x32xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xi32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op input 0 has element type 'i32'; reductions need floating point}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = max reduce_dtype = f32 : tensor<4xi32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op result 0 has element type 'i1'; reductions need floating point}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = max reduce_dtype = f32 : tensor<4xf32> -> !fsdp.future<tensor<4xi1>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xi1>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op reduce_dtype must be a floating-point type, got 'index'}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = max reduce_dtype = index : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op reduction bitwise_and is not supported here; use sum, average, max, min or product}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = bitwise_and reduce_dtype = f32 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op reduction generic is not supported here; use sum, average, max, min or product}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = generic reduce_dtype = f32 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf16>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op average in f16 can overflow; use reduction sum with pre_divide and post_divide}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = average reduce_dtype = f16 : tensor<4xf16> -> !fsdp.future<tensor<4xf16>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf16>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op post_divide applies only to reduction sum}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = max reduce_dtype = f32 post_divide = 4.0 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // Infinity (0x7FF0000000000000) is not a valid factor.
  // expected-error @+1 {{'fsdp.all_reduce_start' op pre_divide must be positive and finite}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 pre_divide = 0x7FF0000000000000 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // NaN (0x7FF8000000000000) is not a valid factor.
  // expected-error @+1 {{'fsdp.all_reduce_start' op post_divide must be positive and finite}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 post_divide = 0x7FF8000000000000 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op @nope does not name an fsdp.unit}}
  %f = fsdp.all_reduce_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32 unit @nope : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op @nope does not name a shard.grid}}
  %f = fsdp.all_reduce_start %g on @nope axes = [0] reduction = sum reduce_dtype = f32 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op needs at least one grid axis}}
  %f = fsdp.all_reduce_start %g on @dp axes = [] reduction = sum reduce_dtype = f32 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @dyn(shape = ?)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op grid axis 0 of @dyn has a dynamic size; collectives need a static group size}}
  %f = fsdp.all_reduce_start %g on @dyn axes = [0] reduction = sum reduce_dtype = f32 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

shard.grid @g(shape = 0)
func.func @f(%g: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.all_reduce_start' op group size over grid axes of @g is not a positive 64-bit integer}}
  %f = fsdp.all_reduce_start %g on @g axes = [0] reduction = sum reduce_dtype = f32 : tensor<4xf32> -> !fsdp.future<tensor<4xf32>>
  %s = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.wait
//===----------------------------------------------------------------------===//

// -----

func.func @f(%f: !fsdp.future<tensor<4xf32>>) {
  // expected-error @+1 {{'fsdp.wait' op future must come straight from an fsdp.*_start op}}
  %g = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}

// -----

func.func @f() {
  %f = fsdp.aten "c10d::all_gather" () : () -> !fsdp.future<tensor<4xf32>>
  // expected-error @+1 {{'fsdp.wait' op future must come straight from an fsdp.*_start op}}
  %g = fsdp.wait %f : !fsdp.future<tensor<4xf32>>
  return
}
// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  // expected-error @+2 {{'fsdp.wait' op inferred type(s) 'tensor<12xf32>' are incompatible with return type(s) of operation 'tensor<12xbf16>'}}
  // expected-error @+1 {{'fsdp.wait' op failed to infer returned types}}
  %g = "fsdp.wait"(%f) : (!fsdp.future<tensor<12xf32>>) -> tensor<12xbf16>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  // expected-error @+2 {{'fsdp.wait' op inferred type(s) 'tensor<12xf32>' are incompatible with return type(s) of operation 'tensor<12xf32>', 'tensor<12xf32>'}}
  // expected-error @+1 {{'fsdp.wait' op failed to infer returned types}}
  %g:2 = "fsdp.wait"(%f) : (!fsdp.future<tensor<12xf32>>) -> (tensor<12xf32>, tensor<12xf32>)
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  // expected-error @+2 {{'fsdp.wait' op inferred type(s) 'tensor<12xf32>' are incompatible with return type(s) of operation}}
  // expected-error @+1 {{'fsdp.wait' op failed to infer returned types}}
  "fsdp.wait"(%f) : (!fsdp.future<tensor<12xf32>>) -> ()
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%w: tensor<3xf32>) {
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  // expected-error @+1 {{'fsdp.wait' op result #0 must be variadic of statically shaped tensor, but got 'tensor<?xf32>'}}
  %g = "fsdp.wait"(%f) : (!fsdp.future<tensor<12xf32>>) -> tensor<?xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.wait' op operand #0 must be !fsdp.future (pending results of a collective), but got 'tensor<4xf32>'}}
  %g = "fsdp.wait"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.all_slice
//===----------------------------------------------------------------------===//

// -----

shard.grid @dp(shape = 4)
func.func @f(%x: tensor<f32>) {
  // expected-error @+1 {{'fsdp.all_slice' op result: dim-0 sharding needs rank >= 1}}
  %s = fsdp.all_slice %x on @dp axes = [0] : tensor<f32> -> tensor<f32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%x: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op result: ranks differ ('tensor<10x32xf32>' vs 'tensor<3xf32>')}}
  %s = fsdp.all_slice %x on @dp axes = [0] : tensor<10x32xf32> -> tensor<3xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%x: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op result: dim 1 differs ('tensor<10x32xf32>' vs 'tensor<3x8xf32>')}}
  %s = fsdp.all_slice %x on @dp axes = [0] : tensor<10x32xf32> -> tensor<3x8xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%x: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op changes the element type from 'f32' to 'bf16'; a slice keeps it}}
  %s = fsdp.all_slice %x on @dp axes = [0] : tensor<10x32xf32> -> tensor<3x32xbf16>
  return
}

// -----

shard.grid @grid2d(shape = 2x2)
func.func @f(%x: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op result: a shard of 10 rows over 2 ranks has 5 rows (ceil(10/2)), not 3}}
  %s = fsdp.all_slice %x on @grid2d axes = [1] : tensor<10x32xf32> -> tensor<3x32xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%x: tensor<9223372036854775807xi8>) {
  // expected-error @+1 {{'fsdp.all_slice' op result: cannot shard 9223372036854775807 rows over 4 ranks}}
  %s = fsdp.all_slice %x on @dp axes = [0] : tensor<9223372036854775807xi8> -> tensor<1xi8>
  return
}

// -----

shard.grid @grid2d(shape = 2x2)
func.func @f(%x: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op grid axis 2 is out of range for @grid2d of rank 2}}
  %s = fsdp.all_slice %x on @grid2d axes = [2] : tensor<10x32xf32> -> tensor<5x32xf32>
  return
}

// -----

shard.grid @grid2d(shape = 2x?)
func.func @f(%x: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op grid axis 1 of @grid2d has a dynamic size; collectives need a static group size}}
  %s = fsdp.all_slice %x on @grid2d axes = [1] : tensor<10x32xf32> -> tensor<5x32xf32>
  return
}

// -----

func.func @f(%x: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op @grid2d does not name a shard.grid}}
  %s = fsdp.all_slice %x on @grid2d axes = [0] : tensor<10x32xf32> -> tensor<5x32xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%x: tensor<?x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op operand #0 must be statically shaped tensor, but got 'tensor<?x32xf32>'}}
  %s = fsdp.all_slice %x on @dp axes = [0] : tensor<?x32xf32> -> tensor<3x32xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
func.func @f(%x: tensor<10x32xf32>) {
  // expected-error @+1 {{'fsdp.all_slice' op result #0 must be statically shaped tensor, but got 'tensor<?x32xf32>'}}
  %s = fsdp.all_slice %x on @dp axes = [0] : tensor<10x32xf32> -> tensor<?x32xf32>
  return
}

// -----

func.func @f(%x: tensor<16xi64>) -> tensor<16xi64> {
  // expected-error @+1 {{'fsdp.data_parallel_sum' op sums floating-point tensors, not 'i64'}}
  %s = fsdp.data_parallel_sum %x : tensor<16xi64>
  return %s : tensor<16xi64>
}

// -----

func.func @f(%x: tensor<?xf32>) -> tensor<?xf32> {
  // expected-error @+1 {{'fsdp.data_parallel_sum' op operand #0 must be statically shaped tensor, but got 'tensor<?xf32>'}}
  %s = fsdp.data_parallel_sum %x : tensor<?xf32>
  return %s : tensor<?xf32>
}

// -----

%x = builtin.unrealized_conversion_cast to tensor<4xf32>
// expected-error @+1 {{'fsdp.data_parallel_sum' op must be inside a function (a training step)}}
%s = fsdp.data_parallel_sum %x : tensor<4xf32>
