// RUN: fsdp-opt %s -split-input-file -verify-diagnostics

// Negative tests for fsdp.unit, fsdp.param and !fsdp.future.

//===----------------------------------------------------------------------===//
// fsdp.unit
//===----------------------------------------------------------------------===//

fsdp.unit @root root
fsdp.unit @other
// expected-error @+1 {{'fsdp.unit' op declares a second root unit; @root is already the root}}
fsdp.unit @second root class "Block"

// -----

// expected-error @+1 {{'fsdp.unit' op is the root and cannot list members: the root wraps what no other unit does}}
fsdp.unit @root root members ["a"]

// -----

// expected-error @+1 {{'fsdp.unit' op lists no members}}
fsdp.unit @g members []

// -----

// expected-error @+1 {{'fsdp.unit' op lists an empty member: the root is not a member}}
fsdp.unit @g members ["a", ""]

// -----

// expected-error @+1 {{'fsdp.unit' op lists member 'a' twice}}
fsdp.unit @g members ["a", "a"]

// -----

fsdp.unit @a
// expected-error @+1 {{'fsdp.unit' op wraps module 'a', which unit @a already wraps}}
fsdp.unit @"a+b" members ["a", "b"]

// -----

fsdp.unit @"a+b" members ["a", "b"]
// expected-error @+1 {{'fsdp.unit' op wraps module 'b', which unit @"a+b" already wraps}}
fsdp.unit @"b+c" members ["b", "c"]

// -----

func.func @f() {
  // expected-error @+1 {{'fsdp.unit' op expects parent op 'builtin.module'}}
  fsdp.unit @root root
  return
}

// -----

// Symbol names are unique across units and parameters.
// expected-note @+1 {{see existing symbol definition here}}
fsdp.unit @root root
// expected-error @+1 {{redefinition of symbol named 'root'}}
fsdp.unit @root

//===----------------------------------------------------------------------===//
// fsdp.param: its own rules
//===----------------------------------------------------------------------===//

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op attribute 'type' failed to satisfy constraint: type attribute of statically shaped tensor}}
fsdp.param @p : tensor<?x32xf32> unit @root

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op attribute 'type' failed to satisfy constraint: type attribute of statically shaped tensor}}
fsdp.param @p : tensor<*xf32> unit @root

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op attribute 'type' failed to satisfy constraint: type attribute of statically shaped tensor}}
fsdp.param @p : f32 unit @root

// -----

func.func @f() {
  // expected-error @+1 {{'fsdp.param' op expects parent op 'builtin.module'}}
  fsdp.param @p : tensor<4xf32> unit @root
  return
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op 'sharded on', 'axes' and 'padding' must be given together}}
"fsdp.param"() <{sym_name = "p", type = tensor<10xf32>, unit = @root, grid = @dp}> : () -> ()

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op 'sharded on', 'axes' and 'padding' must be given together}}
"fsdp.param"() <{sym_name = "p", type = tensor<10xf32>, unit = @root, grid = @dp, grid_axes = array<i16: 0>}> : () -> ()

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op 'sharded on', 'axes' and 'padding' must be given together}}
"fsdp.param"() <{sym_name = "p", type = tensor<10xf32>, unit = @root, padding = 2 : i64}> : () -> ()

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op a sharded parameter needs rank >= 1 (it is split along dim 0)}}
fsdp.param @p : tensor<f32> unit @root sharded on @dp axes = [0] padding = 3

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op is ignored (left whole on every rank), so it cannot be sharded}}
fsdp.param @p : tensor<8xf32> unit @root ignored sharded on @dp axes = [0] padding = 0

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op padding must be non-negative, got -2}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @dp axes = [0] padding = -2

//===----------------------------------------------------------------------===//
// fsdp.param: symbols (unit, grid, axes, padding)
//===----------------------------------------------------------------------===//

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op @nope does not name an fsdp.unit}}
fsdp.param @p : tensor<4xf32> unit @nope

// -----

fsdp.unit @root root
fsdp.param @q : tensor<4xf32> unit @root
// A parameter is not a unit.
// expected-error @+1 {{'fsdp.param' op @q does not name an fsdp.unit}}
fsdp.param @p : tensor<4xf32> unit @q

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op @dp does not name a shard.grid}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @dp axes = [0] padding = 2

// -----

fsdp.unit @root root
// A unit is not a grid.
// expected-error @+1 {{'fsdp.param' op @root does not name a shard.grid}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @root axes = [0] padding = 2

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op needs at least one grid axis}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @dp axes = [] padding = 0

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op grid axis 1 is out of range for @dp of rank 1}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @dp axes = [1] padding = 2

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op grid axis -1 is out of range for @dp of rank 1}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @dp axes = [-1] padding = 2

// -----

shard.grid @hsdp(shape = 2x4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op grid axis 1 is listed twice}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @hsdp axes = [1, 1] padding = 2

// -----

shard.grid @dyn(shape = 2x?)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op grid axis 1 of @dyn has a dynamic size; collectives need a static group size}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @dyn axes = [0, 1] padding = 2

// -----

shard.grid @empty(shape = 0x4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op group size over grid axes of @empty is not a positive 64-bit integer}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @empty axes = [0] padding = 0

// -----

shard.grid @huge(shape = 4294967296x4294967296)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op group size over grid axes of @huge is not a positive 64-bit integer}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @huge axes = [0, 1] padding = 0

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op cannot shard 9223372036854775807 rows over 4 ranks}}
fsdp.param @p : tensor<9223372036854775807xi8> unit @root sharded on @dp axes = [0] padding = 0

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op padding is 0, but 10 rows over 4 ranks pad 2 (4 x 3 - 10)}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @dp axes = [0] padding = 0

// -----

// Hybrid sharding: only the listed axis (size 4) counts.
shard.grid @hsdp(shape = 2x4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op padding is 6, but 10 rows over 4 ranks pad 2 (4 x 3 - 10)}}
fsdp.param @p : tensor<10x3xf32> unit @root sharded on @hsdp axes = [1] padding = 6

// -----

// Both axes of a 2-D grid: 8 ranks.
shard.grid @hsdp(shape = 2x4)
fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op padding is 2, but 10 rows over 8 ranks pad 6 (8 x 2 - 10)}}
fsdp.param @p : tensor<10xf32> unit @root sharded on @hsdp axes = [0, 1] padding = 2

//===----------------------------------------------------------------------===//
// !fsdp.future
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{!fsdp.future result 0 must be a statically shaped tensor, got 'tensor<?xf32>'}}
func.func private @f(!fsdp.future<tensor<?xf32>>)

// -----

// expected-error @+1 {{!fsdp.future result 1 must be a statically shaped tensor, got 'tensor<*xf32>'}}
func.func private @f(!fsdp.future<tensor<4xf32>, tensor<*xf32>>)

// -----

// expected-error @+1 {{!fsdp.future result 0 must be a statically shaped tensor, got 'f32'}}
func.func private @f(!fsdp.future<f32>)

// -----

// expected-error @+1 {{!fsdp.future result 0 must be a statically shaped tensor, got 'memref<4xf32>'}}
func.func private @f(!fsdp.future<memref<4xf32>>)

// -----

// An empty future does not parse.
// expected-error @+2 {{expected non-function type}}
// expected-error @+1 {{failed to parse Fsdp_FutureType parameter 'results'}}
func.func private @f(!fsdp.future<>)

// -----

// expected-error @+1 {{expected '<'}}
func.func private @f(!fsdp.future)

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op tied names must not be empty}}
fsdp.param @w : tensor<4xf32> unit @root tied [""]

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op lists its own name 'w' as tied}}
fsdp.param @w : tensor<4xf32> unit @root tied ["w"]

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op lists tied name 'v' twice}}
fsdp.param @w : tensor<4xf32> unit @root tied ["v", "v"]

// -----

fsdp.unit @root root
// expected-error @+1 {{'fsdp.param' op is tied to @v, which is declared as a parameter of its own}}
fsdp.param @w : tensor<4xf32> unit @root tied ["v"]
fsdp.param @v : tensor<4xf32> unit @root

// -----

// expected-error @+1 {{'fsdp.buffer' op attribute 'type' failed to satisfy constraint: type attribute of statically shaped tensor}}
fsdp.buffer @b : tensor<?xf32>

// -----

func.func @f() {
  // expected-error @+1 {{'fsdp.buffer' op expects parent op 'builtin.module'}}
  fsdp.buffer @b : tensor<2xf32>
  return
}

// -----

// expected-error @+1 {{fsdp.mixed_precision needs param_dtype}}
module attributes {fsdp.mixed_precision = {reduce_dtype = f32}} {
}

// -----

// expected-error @+1 {{fsdp.mixed_precision.param_dtype must be a float type}}
module attributes {fsdp.mixed_precision = {param_dtype = i32}} {
}

// -----

// expected-error @+1 {{fsdp.mixed_precision has unknown field 'compute_dtype'}}
module attributes {fsdp.mixed_precision = {param_dtype = bf16, compute_dtype = bf16}} {
}

// -----

// expected-error @+1 {{fsdp.mixed_precision.cast_forward_inputs must be true or false}}
module attributes {fsdp.mixed_precision = {param_dtype = bf16, cast_forward_inputs = 1}} {
}

// -----

// expected-error @+1 {{fsdp.mixed_precision must be a dictionary on the module}}
func.func private @f() attributes {fsdp.mixed_precision = {param_dtype = bf16}}

// -----

// expected-error @+1 {{fsdp.collective_hash must be a string}}
func.func private @f() attributes {fsdp.collective_hash = 3}

// -----

// expected-error @+1 {{fsdp.collective_count must be an integer}}
func.func private @f() attributes {fsdp.collective_count = "3"}

// -----

// expected-error @+1 {{fsdp.memory must be a dictionary of integers}}
func.func private @f() attributes {fsdp.memory = {peak = "big"}}

// -----

func.func @f(%x: tensor<2xf32>) {
  // expected-error @+1 {{fsdp.recomputed must be a unit attribute on an op of a function}}
  %y = fsdp.aten "aten::relu" (%x) {fsdp.recomputed = true} : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

// expected-error @+1 {{fsdp.recomputed must be a unit attribute on an op of a function}}
module attributes {fsdp.recomputed} {
}

// -----

func.func @f(%x: tensor<2xf32>) {
  // expected-error @+1 {{a recomputed call runs in backward, and checkpoint regions mark forward calls}}
  %y = fsdp.aten "aten::relu" (%x) module "mlp" checkpoint 0 {fsdp.recomputed} : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

// expected-error @+1 {{unknown fsdp attribute 'fsdp.memroy'}}
func.func private @f() attributes {fsdp.memroy = {peak = 1}}

// -----

// expected-error @+1 {{fsdp.device 'tpu' is not a device fsdpc targets; use cpu or cuda}}
module attributes {fsdp.device = "tpu"} {
}

// -----

// expected-error @+1 {{fsdp.device must be a string on the module}}
module attributes {fsdp.device = 1 : i64} {
}

// -----

// expected-error @+1 {{fsdp.device must be a string on the module}}
func.func private @f() attributes {fsdp.device = "cuda"}
