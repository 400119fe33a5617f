// RUN: fsdp-opt %s --fsdp-simplify-backward | FileCheck %s
// RUN: fsdp-opt %s --fsdp-sharding-pipeline="ranks=2" | FileCheck %s --check-prefix=PIPELINE

fsdp.unit @root root class "Net"
fsdp.param @w : tensor<8x16xf32> unit @root
func.func @train_step(%x: tensor<8x16xf32>, %g: tensor<8x16xf32>, %lo: tensor<8x8xf32>, %hi: tensor<8x8xf32>) -> tensor<f32> {
  %w = fsdp.get_param @w : tensor<8x16xf32>
  %y = fsdp.aten "aten::mul.Tensor" (%x, %w) module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %l = fsdp.aten "aten::sum" (%y) module "" : (tensor<8x16xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  // x^1 is x; x^2 and x^1.5 stay.
  %p1 = fsdp.aten "aten::pow.Tensor_Scalar" (%x) args [0 : index, 1.0] module "" : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %p2 = fsdp.aten "aten::pow.Tensor_Scalar" (%x) args [0 : index, 2] module "" : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %p3 = fsdp.aten "aten::pow.Tensor_Scalar" (%x) args [0 : index, 1.5] module "" : (tensor<8x16xf32>) -> tensor<8x16xf32>
  // Two halves scattered into zeros and summed onto %g: one concatenation.
  %z0 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, "strided", "<device>", false] module "" : () -> tensor<8x16xf32>
  %s0 = fsdp.aten "aten::slice_scatter" (%z0, %hi) args [0 : index, 1 : index, 1, 8, 9223372036854775807, 1] module "" : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %a0 = fsdp.aten "aten::add.Tensor" (%g, %s0) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %z1 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, "strided", "<device>", false] module "" : () -> tensor<8x16xf32>
  %s1 = fsdp.aten "aten::slice_scatter" (%z1, %lo) args [0 : index, 1 : index, -1, 0, 8, 1] module "" : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %a1 = fsdp.aten "aten::add.Tensor" (%a0, %s1) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  // Not rewritten: the slices overlap; a fill that is not zero; alpha 2.
  %z2 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, "strided", "<device>", false] module "" : () -> tensor<8x16xf32>
  %s2 = fsdp.aten "aten::slice_scatter" (%z2, %hi) args [0 : index, 1 : index, 1, 7, 15, 1] module "" : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %a2 = fsdp.aten "aten::add.Tensor" (%g, %s2) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %z3 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, "strided", "<device>", false] module "" : () -> tensor<8x16xf32>
  %s3 = fsdp.aten "aten::slice_scatter" (%z3, %lo) args [0 : index, 1 : index, 1, 0, 8, 1] module "" : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %a3 = fsdp.aten "aten::add.Tensor" (%a2, %s3) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %o4 = fsdp.aten "aten::full" () args [[8, 16], 1, f32, "strided", "<device>", false] module "" : () -> tensor<8x16xf32>
  %s4 = fsdp.aten "aten::slice_scatter" (%o4, %hi) args [0 : index, 1 : index, 1, 8, 16, 1] module "" : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %a4 = fsdp.aten "aten::add.Tensor" (%g, %s4) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %z5 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, "strided", "<device>", false] module "" : () -> tensor<8x16xf32>
  %s5 = fsdp.aten "aten::slice_scatter" (%z5, %lo) args [0 : index, 1 : index, 1, 0, 8, 1] module "" : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %a5 = fsdp.aten "aten::add.Tensor" (%a4, %s5) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %z6 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, "strided", "<device>", false] module "" : () -> tensor<8x16xf32>
  %s6 = fsdp.aten "aten::slice_scatter" (%z6, %hi) args [0 : index, 1 : index, 1, 8, 16, 1] module "" : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %a6 = fsdp.aten "aten::add.Tensor" (%g, %s6) args [0 : index, 1 : index, 2] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %z7 = fsdp.aten "aten::full" () args [[8, 16], 0, f32, "strided", "<device>", false] module "" : () -> tensor<8x16xf32>
  %s7 = fsdp.aten "aten::slice_scatter" (%z7, %lo) args [0 : index, 1 : index, 1, 0, 8, 1] module "" : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %a7 = fsdp.aten "aten::add.Tensor" (%a6, %s7) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %r = fsdp.aten "aten::stack" (%p1, %p2, %p3, %a1, %a3, %a5, %a7) args [[0 : index, 1 : index, 2 : index, 3 : index, 4 : index, 5 : index, 6 : index], 0] module "" : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<7x8x16xf32>
  %gw = fsdp.aten "aten::sum.dim_IntList" (%r) args [0 : index, [0], false, unit] module "" : (tensor<7x8x16xf32>) -> tensor<8x16xf32>
  fsdp.gradients [@w] %gw : tensor<8x16xf32>
  return %l : tensor<f32>
}

// CHECK-LABEL: func.func @train_step
// CHECK-SAME:    (%[[X:[^:]*]]: tensor<8x16xf32>, %[[G:[^:]*]]: tensor<8x16xf32>, %[[LO:[^:]*]]: tensor<8x8xf32>, %[[HI:[^:]*]]: tensor<8x8xf32>)
// CHECK-NOT:     args [0 : index, 1.0
// CHECK:         %[[P2:.*]] = fsdp.aten "aten::pow.Tensor_Scalar"(%[[X]]) args [0 : index, 2]
// CHECK-NEXT:    %[[P3:.*]] = fsdp.aten "aten::pow.Tensor_Scalar"(%[[X]]) args [0 : index, 1.5
// CHECK-NEXT:    %[[CAT:.*]] = fsdp.aten "aten::cat"(%[[LO]], %[[HI]]) args {{\[}}[0 : index, 1 : index], 1]
// CHECK-NEXT:    %[[A1:.*]] = fsdp.aten "aten::add.Tensor"(%[[G]], %[[CAT]]) args [0 : index, 1 : index, 1]
// Overlapping slices, a fill of ones and alpha 2 keep their scatters.
// CHECK-COUNT-6: aten::slice_scatter
// CHECK:         fsdp.aten "aten::stack"(%[[X]], %[[P2]], %[[P3]], %[[A1]],

// The sharding pipeline simplifies before it shards.
// PIPELINE-NOT:  args [0 : index, 1.0
// PIPELINE:      aten::cat
