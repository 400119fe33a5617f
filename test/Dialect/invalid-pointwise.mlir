// RUN: fsdp-opt %s -split-input-file -verify-diagnostics

// Negative tests for fsdp.pointwise and fsdp.yield: one per rule.

func.func @no_results(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.pointwise' op has 1 input and 0 results; a kernel takes 1 to 8 of each}}
  fsdp.pointwise (%x) : (tensor<4xf32>) -> () {
  ^bb0(%a: tensor<4xf32>):
    fsdp.yield
  }
  return
}

// -----

func.func @nine_inputs(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'fsdp.pointwise' op has 9 inputs and 1 result; a kernel takes 1 to 8 of each}}
  %y = fsdp.pointwise (%x, %x, %x, %x, %x, %x, %x, %x, %x)
      : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>, %c: tensor<4xf32>, %d: tensor<4xf32>, %e: tensor<4xf32>, %f: tensor<4xf32>, %g: tensor<4xf32>, %h: tensor<4xf32>, %i: tensor<4xf32>):
    fsdp.yield %a : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @argument_types(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'fsdp.pointwise' op body arguments must have the inputs' types}}
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<2xf32>):
    %n = fsdp.aten "aten::neg"(%a) : (tensor<2xf32>) -> tensor<2xf32>
    fsdp.yield %n : tensor<2xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @yield_types(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'fsdp.pointwise' op fsdp.yield must name one value of each result's type}}
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %n = fsdp.aten "aten::neg"(%a) : (tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %n, %n : tensor<4xf32>, tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @result_shapes(%x: tensor<4x4xf32>, %r: tensor<4x1xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'fsdp.pointwise' op results must share one shape, got 'tensor<4x4xf32>' and 'tensor<4x1xf32>'}}
  %y, %z = fsdp.pointwise (%x, %r) : (tensor<4x4xf32>, tensor<4x1xf32>) -> (tensor<4x4xf32>, tensor<4x1xf32>) {
  ^bb0(%a: tensor<4x4xf32>, %b: tensor<4x1xf32>):
    %e = fsdp.aten "aten::exp"(%b) : (tensor<4x1xf32>) -> tensor<4x1xf32>
    %m = fsdp.aten "aten::mul.Tensor"(%a, %e) : (tensor<4x4xf32>, tensor<4x1xf32>) -> tensor<4x4xf32>
    fsdp.yield %m, %e : tensor<4x4xf32>, tensor<4x1xf32>
  }
  return %y : tensor<4x4xf32>
}

// -----

func.func @element_types(%x: tensor<4xf32>) -> tensor<4xbf16> {
  // expected-error @+1 {{'fsdp.pointwise' op inputs and results must share one element type, f32, bf16 or f16; got 'tensor<4xf32>' with results of 'tensor<4xbf16>'}}
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xbf16> {
  ^bb0(%a: tensor<4xf32>):
    %n = fsdp.aten "aten::neg"(%a) : (tensor<4xf32>) -> tensor<4xbf16>
    fsdp.yield %n : tensor<4xbf16>
  }
  return %y : tensor<4xbf16>
}

// -----

func.func @double(%x: tensor<4xf64>) -> tensor<4xf64> {
  // expected-error @+1 {{'fsdp.pointwise' op inputs and results must share one element type, f32, bf16 or f16; got 'tensor<4xf64>' with results of 'tensor<4xf64>'}}
  %y = fsdp.pointwise (%x) : (tensor<4xf64>) -> tensor<4xf64> {
  ^bb0(%a: tensor<4xf64>):
    %n = fsdp.aten "aten::neg"(%a) : (tensor<4xf64>) -> tensor<4xf64>
    fsdp.yield %n : tensor<4xf64>
  }
  return %y : tensor<4xf64>
}

// -----

func.func @input_broadcast(%x: tensor<3xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'fsdp.pointwise' op input 'tensor<3xf32>' does not broadcast to the results' shape 'tensor<4xf32>'}}
  %y = fsdp.pointwise (%x) : (tensor<3xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<3xf32>):
    %n = fsdp.aten "aten::neg"(%a) : (tensor<3xf32>) -> tensor<4xf32>
    fsdp.yield %n : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @inputs_smaller(%x: tensor<4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{'fsdp.pointwise' op the inputs broadcast to 'tensor<4xf32>', not to the results' shape 'tensor<2x4xf32>'}}
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %n = fsdp.aten "aten::neg"(%a) : (tensor<4xf32>) -> tensor<2x4xf32>
    fsdp.yield %n : tensor<2x4xf32>
  }
  return %y : tensor<2x4xf32>
}

// -----

func.func @not_aten(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'fsdp.cast' op cannot be computed by a pointwise kernel: only fsdp.aten calls can}}
    %c = fsdp.cast %a : tensor<4xf32> to tensor<4xf32>
    fsdp.yield %c : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @not_elementwise(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    // expected-error @+1 {{'fsdp.aten' op cannot be computed element by element: 'aten::mm' is not an elementwise operator a kernel can compute}}
    %m = fsdp.aten "aten::mm"(%a, %a) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    fsdp.yield %m : tensor<4x4xf32>
  }
  return %y : tensor<4x4xf32>
}

// -----

func.func @literal_kind(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'fsdp.aten' op cannot be computed element by element: argument 1 is not a number}}
    %p = fsdp.aten "aten::pow.Tensor_Scalar"(%a) args [0 : index, "two"] : (tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %p : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @literal_not_finite(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'fsdp.aten' op cannot be computed element by element: argument 1 is not a finite number}}
    %p = fsdp.aten "aten::mul.Tensor"(%a) args [0 : index, 0x7F800000 : f32] : (tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %p : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @gelu_mode(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'fsdp.aten' op cannot be computed element by element: argument 1 must be "none" or "tanh"}}
    %g = fsdp.aten "aten::gelu"(%a) args [0 : index, "erf"] : (tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %g : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @random(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'fsdp.aten' op cannot be computed element by element: a random call}}
    %n = fsdp.aten "aten::neg"(%a) random : (tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %n : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @operand_type(%x: tensor<4xf32>, %h: tensor<4xf16>) -> tensor<4xf32> {
  // expected-error @+1 {{'fsdp.pointwise' op inputs and results must share one element type, f32, bf16 or f16; got 'tensor<4xf16>' with results of 'tensor<4xf32>'}}
  %y = fsdp.pointwise (%x, %h) : (tensor<4xf32>, tensor<4xf16>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>, %b: tensor<4xf16>):
    %m = fsdp.aten "aten::mul.Tensor"(%a, %b) : (tensor<4xf32>, tensor<4xf16>) -> tensor<4xf32>
    fsdp.yield %m : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @inner_operand_type(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'fsdp.aten' op cannot be computed element by element: argument 0 is not a tensor of the result's element type}}
    %n = fsdp.aten "aten::neg"(%a) : (tensor<4xf32>) -> tensor<4xf16>
    %m = fsdp.aten "aten::neg"(%a) : (tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %m : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @inner_shape(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'fsdp.aten' op result 'tensor<2x4xf32>' does not broadcast to the kernel's shape 'tensor<4xf32>'}}
    %n = fsdp.aten "aten::neg"(%a) : (tensor<4xf32>) -> tensor<2x4xf32>
    %m = fsdp.aten "aten::neg"(%a) : (tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %m : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @yield_outside(%x: tensor<4xf32>) {
  // expected-error @+1 {{'fsdp.yield' op expects parent op 'fsdp.pointwise'}}
  fsdp.yield %x : tensor<4xf32>
}

// -----

// A bool input would make the jiterator cast every input dynamically.
func.func @bool_input(%c: tensor<4xi1>, %x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'fsdp.pointwise' op inputs and results must share one element type, f32, bf16 or f16; got 'tensor<4xi1>' with results of 'tensor<4xf32>'}}
  %y = fsdp.pointwise (%c, %x) : (tensor<4xi1>, tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xi1>, %b: tensor<4xf32>):
    %w = fsdp.aten "aten::where.self"(%a, %b, %b) : (tensor<4xi1>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %w : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

// A comparison's result is read only as a condition.
func.func @comparison_read_as_number(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %n = fsdp.aten "aten::ne.Scalar"(%a) args [0 : index, 0] : (tensor<4xf32>) -> tensor<4xi1>
    // expected-error @+1 {{'fsdp.aten' op cannot be computed element by element: argument 0 is not a tensor of the result's element type}}
    %m = fsdp.aten "aten::mul.Tensor"(%n, %a) : (tensor<4xi1>, tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %m : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @comparison_not_bool(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = fsdp.pointwise (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'fsdp.aten' op cannot be computed element by element: its result is not one bool tensor}}
    %n = fsdp.aten "aten::ne.Scalar"(%a) args [0 : index, 0] : (tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %n : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @bool_result(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xi1>) {
  // expected-error @+1 {{'fsdp.pointwise' op inputs and results must share one element type, f32, bf16 or f16; got 'tensor<4xi1>' with results of 'tensor<4xf32>'}}
  %y:2 = fsdp.pointwise (%x) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xi1>) {
  ^bb0(%a: tensor<4xf32>):
    %n = fsdp.aten "aten::ne.Scalar"(%a) args [0 : index, 0] : (tensor<4xf32>) -> tensor<4xi1>
    %w = fsdp.aten "aten::where.self"(%n, %a, %a) : (tensor<4xi1>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    fsdp.yield %w, %n : tensor<4xf32>, tensor<4xi1>
  }
  return %y#0, %y#1 : tensor<4xf32>, tensor<4xi1>
}
