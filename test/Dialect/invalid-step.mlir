// RUN: fsdp-opt %s -split-input-file -verify-diagnostics
// RUN: not fsdp-opt %s -split-input-file 2>&1 | FileCheck %s --check-prefix=LOC

// Negative tests for the training-step body: fsdp.get_param, fsdp.aten,
// fsdp.cast, fsdp.loss and fsdp.gradients.

// Errors come with the file, line and column of the op and fail the run.
// LOC: invalid-step.mlir:[[# @LINE + 5]]:8: error: 'fsdp.get_param' op @nope does not name an fsdp.param
// LOC: invalid-step.mlir:{{[0-9]+}}:{{[0-9]+}}: error: 'fsdp.aten' op 'relu' is not an operator name

func.func @f() {
  // expected-error @+1 {{'fsdp.get_param' op @nope does not name an fsdp.param}}
  %0 = fsdp.get_param @nope : tensor<4xf32>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.get_param
//===----------------------------------------------------------------------===//

// -----

fsdp.unit @root root
func.func @f() {
  // A unit is not a parameter.
  // expected-error @+1 {{'fsdp.get_param' op @root does not name an fsdp.param}}
  %0 = fsdp.get_param @root : tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @p : tensor<10x32xf32> unit @root
func.func @f() {
  // expected-error @+1 {{'fsdp.get_param' op result type 'tensor<10x32xbf16>' is not the local type of @p, 'tensor<10x32xf32>'}}
  %0 = fsdp.get_param @p : tensor<10x32xbf16>
  return
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @p : tensor<10x32xf32> unit @root sharded on @dp axes = [0] padding = 2
func.func @f() {
  // A sharded parameter is read as its padded shard, not the logical tensor.
  // expected-error @+1 {{'fsdp.get_param' op result type 'tensor<10x32xf32>' is not the local type of @p, 'tensor<3x32xf32>' (its padded shard)}}
  %0 = fsdp.get_param @p : tensor<10x32xf32>
  return
}

// -----

shard.grid @hsdp(shape = 2x4)
fsdp.unit @root root
fsdp.param @p : tensor<10xf32> unit @root sharded on @hsdp axes = [0] padding = 0
func.func @f() {
  // expected-error @+1 {{'fsdp.get_param' op result type 'tensor<2xf32>' is not the local type of @p, 'tensor<5xf32>' (its padded shard)}}
  %0 = fsdp.get_param @p : tensor<2xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @p : tensor<4xf32> unit @root
// expected-error @+1 {{'fsdp.get_param' op must be inside a function (a training step)}}
%0 = fsdp.get_param @p : tensor<4xf32>

// -----

fsdp.unit @root root
fsdp.param @p : tensor<4xf32> unit @root
func.func @f() {
  // expected-error @+1 {{'fsdp.get_param' op result #0 must be statically shaped tensor, but got 'tensor<?xf32>'}}
  %0 = fsdp.get_param @p : tensor<?xf32>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.aten
//===----------------------------------------------------------------------===//

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op 'relu' is not an operator name of the form ns::name[.overload]}}
  %0 = fsdp.aten "relu" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op 'aten::' is not an operator name of the form ns::name[.overload]}}
  %0 = fsdp.aten "aten::" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op checkpoint region -1 is negative; regions are numbered from 0}}
  %0 = fsdp.aten "aten::relu" (%x) module "mlp" checkpoint -1 : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op '::relu' is not an operator name of the form ns::name[.overload]}}
  %0 = fsdp.aten "::relu" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op 'aten::add.' is not an operator name of the form ns::name[.overload]}}
  %0 = fsdp.aten "aten::add." (%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op 'aten::add.Tensor.out' is not an operator name of the form ns::name[.overload]}}
  %0 = fsdp.aten "aten::add.Tensor.out" (%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op 'aten::2relu' is not an operator name of the form ns::name[.overload]}}
  %0 = fsdp.aten "aten::2relu" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op 'aten::leaky-relu' is not an operator name of the form ns::name[.overload]}}
  %0 = fsdp.aten "aten::leaky-relu" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op 'aten::add_.Tensor' is an in-place operator; capture must be functional}}
  %0 = fsdp.aten "aten::add_.Tensor" (%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op 'aten::__iand__.Tensor' is an in-place operator; capture must be functional}}
  %0 = fsdp.aten "aten::__iand__.Tensor" (%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op args refers to operand 1, but the op has 1 operand}}
  %0 = fsdp.aten "aten::relu" (%x) args [1 : index] : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op args refers to operand -1, but the op has 1 operand}}
  %0 = fsdp.aten "aten::relu" (%x) args [-1 : index] : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // Operand indices inside lists are checked too.
  // expected-error @+1 {{'fsdp.aten' op args refers to operand 2, but the op has 2 operands}}
  %0 = fsdp.aten "aten::cat" (%x, %x) args [[0 : index, 1 : index, 2 : index], 0] : (tensor<4xf32>, tensor<4xf32>) -> tensor<12xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'fsdp.aten' op args entry @sym is not an operand index, list or literal (integer, float, string, type, unit)}}
  %0 = fsdp.aten "aten::ones" () args [[4], @sym] : () -> tensor<4xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'fsdp.aten' op args entry dense<4> : tensor<1xi64> is not an operand index, list or literal (integer, float, string, type, unit)}}
  %0 = fsdp.aten "aten::ones" () args [[dense<4> : tensor<1xi64>], f32] : () -> tensor<4xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'fsdp.aten' op args entry {size = 4 : i64} is not an operand index, list or literal (integer, float, string, type, unit)}}
  %0 = fsdp.aten "aten::ones" () args [{size = 4}] : () -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>, %y: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op operand 1 is referenced nowhere in args; each operand is referenced exactly once}}
  %0 = fsdp.aten "aten::add.Tensor" (%x, %y) args [0 : index, 1] : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.aten' op operand 0 is referenced 2 times in args; each operand is referenced exactly once}}
  %0 = fsdp.aten "aten::add.Tensor" (%x) args [0 : index, [0 : index]] : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // An empty args list references no operand.
  // expected-error @+1 {{'fsdp.aten' op operand 0 is referenced nowhere in args; each operand is referenced exactly once}}
  %0 = fsdp.aten "aten::relu" (%x) args [] : (tensor<4xf32>) -> tensor<4xf32>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.cast
//===----------------------------------------------------------------------===//

// -----

func.func @f(%x: tensor<8x32xf32>) {
  // expected-error @+1 {{'fsdp.cast' op changes the shape from 'tensor<8x32xf32>' to 'tensor<256xbf16>'; a cast keeps the shape}}
  %0 = fsdp.cast %x : tensor<8x32xf32> to tensor<256xbf16>
  return
}

// -----

func.func @f(%x: tensor<8x32xf32>) {
  // expected-error @+1 {{'fsdp.cast' op changes the shape from 'tensor<8x32xf32>' to 'tensor<8x16xf32>'; a cast keeps the shape}}
  %0 = fsdp.cast %x : tensor<8x32xf32> to tensor<8x16xf32>
  return
}

// -----

func.func @f(%x: tensor<4xindex>) {
  // expected-error @+1 {{'fsdp.cast' op casts integer and floating-point tensors, not 'index'}}
  %0 = fsdp.cast %x : tensor<4xindex> to tensor<4xi64>
  return
}

// -----

func.func @f(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.cast' op casts integer and floating-point tensors, not 'complex<f32>'}}
  %0 = fsdp.cast %x : tensor<4xf32> to tensor<4xcomplex<f32>>
  return
}

// -----

func.func @f(%x: tensor<*xf32>) {
  // expected-error @+1 {{'fsdp.cast' op operand #0 must be ranked tensor of any type values, but got 'tensor<*xf32>'}}
  %0 = "fsdp.cast"(%x) : (tensor<*xf32>) -> tensor<4xbf16>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.loss
//===----------------------------------------------------------------------===//

// -----

func.func @f(%l: tensor<1xf32>) {
  // expected-error @+1 {{'fsdp.loss' op operand #0 must be 0D tensor of floating-point values, but got 'tensor<1xf32>'}}
  fsdp.loss %l : tensor<1xf32>
  return
}

// -----

func.func @f(%l: tensor<i64>) {
  // expected-error @+1 {{'fsdp.loss' op operand #0 must be 0D tensor of floating-point values, but got 'tensor<i64>'}}
  fsdp.loss %l : tensor<i64>
  return
}

// -----

// expected-error @+1 {{'fsdp.aten' op must be inside a function (a training step)}}
%l = fsdp.aten "aten::zeros" () args [[], f32] : () -> tensor<f32>

// -----

func.func @f(%l: tensor<f32>) {
  // expected-note @+1 {{the first one}}
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.loss' op appears twice in one function; a step has one loss}}
  fsdp.loss %l : tensor<f32>
  return
}

//===----------------------------------------------------------------------===//
// fsdp.gradients
//===----------------------------------------------------------------------===//

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
fsdp.param @b : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op lists 2 parameters but 1 gradient}}
  fsdp.gradients [@a, @b] %g : tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op lists 1 parameter but 2 gradients}}
  fsdp.gradients [@a] %g, %g : tensor<4xf32>, tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op @m::@a is not a parameter name (@fqn)}}
  fsdp.gradients [@m::@a] %g : tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op @a is listed twice; a parameter has one gradient}}
  fsdp.gradients [@a, @a] %g, %g : tensor<4xf32>, tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-note @+1 {{the first one}}
  fsdp.gradients [@a] %g : tensor<4xf32>
  // expected-error @+1 {{'fsdp.gradients' op appears twice in one function; a step has one gradients op}}
  fsdp.gradients [@a] %g : tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%g: tensor<4xf32>) {
  // No loss at all.
  // expected-error @+1 {{'fsdp.gradients' op must follow the function's fsdp.loss (gradients belong to the backward pass)}}
  fsdp.gradients [@a] %g : tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  // The loss comes after the gradients.
  // expected-error @+1 {{'fsdp.gradients' op must follow the function's fsdp.loss (gradients belong to the backward pass)}}
  fsdp.gradients [@a] %g : tensor<4xf32>
  fsdp.loss %l : tensor<f32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op @nope does not name an fsdp.param}}
  fsdp.gradients [@a, @nope] %g, %g : tensor<4xf32>, tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root frozen
func.func @f(%l: tensor<f32>, %g: tensor<4xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op @a is frozen and has no gradient}}
  fsdp.gradients [@a] %g : tensor<4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @a : tensor<4xf32> unit @root
func.func @f(%l: tensor<f32>, %g: tensor<4xbf16>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op gradient of @a has type 'tensor<4xbf16>', expected 'tensor<4xf32>' (its logical type)}}
  fsdp.gradients [@a] %g : tensor<4xbf16>
  return
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @a : tensor<10x32xf32> unit @root sharded on @dp axes = [0] padding = 2
func.func @f(%l: tensor<f32>, %g: tensor<10x32xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op gradient of @a has type 'tensor<10x32xf32>', expected 'tensor<3x32xf32>' (its padded shard)}}
  fsdp.gradients [@a] %g : tensor<10x32xf32>
  return
}

// -----

func.func @f(%l: tensor<f32>, %g: tensor<*xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op operand #0 must be variadic of ranked tensor of any type values, but got 'tensor<*xf32>'}}
  fsdp.gradients [@a] %g : tensor<*xf32>
  return
}

// -----

func.func @f(%l: tensor<f32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op lists no gradients; a step without any omits the op}}
  "fsdp.gradients"() <{params = []}> : () -> ()
  return
}

// -----

// "Once per function" spans all the blocks of the body.
func.func @f(%l: tensor<f32>) {
  // expected-note @+1 {{the first one}}
  fsdp.loss %l : tensor<f32>
  return
^bb1:
  // expected-error @+1 {{'fsdp.loss' op appears twice in one function; a step has one loss}}
  fsdp.loss %l : tensor<f32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @p : tensor<2xf32> unit @root
func.func @f() {
  // expected-error @+1 {{'fsdp.get_buffer' op @p does not name an fsdp.buffer}}
  %0 = fsdp.get_buffer @p : tensor<2xf32>
  return
}

// -----

fsdp.buffer @b : tensor<2xf32>
func.func @f() {
  // expected-error @+1 {{'fsdp.get_buffer' op result type 'tensor<3xf32>' is not the type of @b, 'tensor<2xf32>'}}
  %0 = fsdp.get_buffer @b : tensor<3xf32>
  return
}

// -----

fsdp.buffer @b : tensor<2xf32>
// expected-error @+1 {{'fsdp.get_buffer' op must be inside a function (a training step)}}
%0 = fsdp.get_buffer @b : tensor<2xf32>

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @w : tensor<10x4xf32> unit @root sharded on @dp axes = [0] padding = 2
func.func @f(%l: tensor<f32>, %g: tensor<3x4xf32>) {
  fsdp.loss %l : tensor<f32>
  // expected-error @+1 {{'fsdp.gradients' op gradient of @w has type 'tensor<3x4xf32>', expected 'tensor<10x4xf32>' (its logical type)}}
  fsdp.gradients [@w] %g unreduced : tensor<3x4xf32>
  return
}

// -----

fsdp.unit @root root
fsdp.param @w : tensor<4xf32> unit @root frozen
func.func @f() {
  // expected-error @+1 {{'fsdp.get_accumulated_grad' op @w is frozen and accumulates no gradient}}
  %0 = fsdp.get_accumulated_grad @w : tensor<4xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @w : tensor<10x4xf32> unit @root sharded on @dp axes = [0] padding = 2
func.func @f() {
  // expected-error @+1 {{'fsdp.get_accumulated_grad' op result type 'tensor<3x4xf32>' is not the logical type of @w, 'tensor<10x4xf32>'}}
  %0 = fsdp.get_accumulated_grad @w : tensor<3x4xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'fsdp.get_accumulated_grad' op @w does not name an fsdp.param}}
  %0 = fsdp.get_accumulated_grad @w : tensor<4xf32>
  return
}
