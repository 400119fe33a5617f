// RUN: fsdp-opt %s --fsdp-fold-add-into-matmul | FileCheck %s
// RUN: fsdp-opt %s --fsdp-sharding-pipeline="ranks=2" | FileCheck %s --check-prefix=PIPELINE

fsdp.unit @root root class "Net"
fsdp.param @w : tensor<4x16xf32> unit @root
func.func @train_step(%a: tensor<8x4xf32>, %c: tensor<8x16xf32>) -> tensor<f32> {
  %w = fsdp.get_param @w : tensor<4x16xf32>
  %base = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %x = fsdp.aten "aten::view" (%base) args [0 : index, [2, 4, 16]] module "" : (tensor<8x16xf32>) -> tensor<2x4x16xf32>
  // A residual through a view: one addmm onto x viewed as the product.
  %m1 = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %v1 = fsdp.aten "aten::view" (%m1) args [0 : index, [2, 4, 16]] module "" : (tensor<8x16xf32>) -> tensor<2x4x16xf32>
  %s1 = fsdp.aten "aten::add.Tensor" (%x, %v1) args [0 : index, 1 : index, 1] module "" : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
  // The product first, no view.
  %m2 = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %s2 = fsdp.aten "aten::add.Tensor" (%m2, %base) args [0 : index, 1 : index, 1.0] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  // Two products summed: the later one accumulates onto the earlier.
  %m3 = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %m4 = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %s3 = fsdp.aten "aten::add.Tensor" (%m3, %m4) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  // Not folded: the product read again; alpha 2; a broadcast addend; an
  // addend laid out transposed; an addend made after the product.
  %m5 = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %s5 = fsdp.aten "aten::add.Tensor" (%base, %m5) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %m6 = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %s6 = fsdp.aten "aten::add.Tensor" (%base, %m6) args [0 : index, 1 : index, 2] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %row = fsdp.aten "aten::sum.dim_IntList" (%base) args [0 : index, [0], false, unit] module "" : (tensor<8x16xf32>) -> tensor<16xf32>
  %m7 = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %s7 = fsdp.aten "aten::add.Tensor" (%m7, %row) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  %t = fsdp.aten "aten::permute" (%c) args [0 : index, [1, 0]] module "" : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %tm = fsdp.aten "aten::mm" (%t, %c) module "" : (tensor<16x8xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
  %tt = fsdp.aten "aten::permute" (%tm) args [0 : index, [1, 0]] module "" : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %m8 = fsdp.aten "aten::mm" (%t, %c) module "" : (tensor<16x8xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
  %s8 = fsdp.aten "aten::add.Tensor" (%tt, %m8) args [0 : index, 1 : index, 1] module "" : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %m9 = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %late = fsdp.aten "aten::mm" (%a, %w) module "" : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %late2 = fsdp.aten "aten::mul.Tensor" (%late, %late) module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %s9 = fsdp.aten "aten::add.Tensor" (%m9, %late2) args [0 : index, 1 : index, 1] module "" : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %f1 = fsdp.aten "aten::view" (%s1) args [0 : index, [8, 16]] module "" : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
  %r = fsdp.aten "aten::stack" (%f1, %s2, %s3, %s5, %m5, %s6, %s7, %s9) args [[0 : index, 1 : index, 2 : index, 3 : index, 4 : index, 5 : index, 6 : index, 7 : index], 0] module "" : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8x16xf32>
  %l0 = fsdp.aten "aten::sum" (%r) module "" : (tensor<8x8x16xf32>) -> tensor<f32>
  %l1 = fsdp.aten "aten::sum" (%s8) module "" : (tensor<16x16xf32>) -> tensor<f32>
  %l = fsdp.aten "aten::add.Tensor" (%l0, %l1) args [0 : index, 1 : index, 1] module "" : (tensor<f32>, tensor<f32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %at = fsdp.aten "aten::permute" (%a) args [0 : index, [1, 0]] module "" : (tensor<8x4xf32>) -> tensor<4x8xf32>
  %g = fsdp.aten "aten::mm" (%at, %c) module "" : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  fsdp.gradients [@w] %g : tensor<4x16xf32>
  return %l : tensor<f32>
}

// CHECK-LABEL: func.func @train_step
// CHECK-SAME:    (%[[A:[^:]*]]: tensor<8x4xf32>, %[[C:[^:]*]]: tensor<8x16xf32>)
// CHECK:         %[[W:.*]] = fsdp.get_param @w
// CHECK:         %[[BASE:.*]] = fsdp.aten "aten::mm"(%[[A]], %[[W]])
// CHECK:         %[[X:.*]] = fsdp.aten "aten::view"(%[[BASE]]) args [0 : index, [2, 4, 16]]
// CHECK:         %[[X2:.*]] = fsdp.aten "aten::view"(%[[X]]) args [0 : index, [8, 16]]
// CHECK-NEXT:    %[[P1:.*]] = fsdp.aten "aten::addmm"(%[[X2]], %[[A]], %[[W]]) args [0 : index, 1 : index, 2 : index, 1, 1]
// CHECK-NEXT:    %[[S1:.*]] = fsdp.aten "aten::view"(%[[P1]]) args [0 : index, [2, 4, 16]]
// CHECK-NEXT:    %[[S2:.*]] = fsdp.aten "aten::addmm"(%[[BASE]], %[[A]], %[[W]])
// CHECK-NEXT:    %[[M3:.*]] = fsdp.aten "aten::mm"(%[[A]], %[[W]])
// CHECK-NEXT:    %[[S3:.*]] = fsdp.aten "aten::addmm"(%[[M3]], %[[A]], %[[W]])
// CHECK-NEXT:    %[[M5:.*]] = fsdp.aten "aten::mm"
// CHECK-NEXT:    fsdp.aten "aten::add.Tensor"(%[[BASE]], %[[M5]])
// CHECK-NEXT:    %[[M6:.*]] = fsdp.aten "aten::mm"
// CHECK-NEXT:    fsdp.aten "aten::add.Tensor"(%[[BASE]], %[[M6]]) args [0 : index, 1 : index, 2]
// CHECK:         %[[M7:.*]] = fsdp.aten "aten::mm"
// CHECK-NEXT:    fsdp.aten "aten::add.Tensor"(%[[M7]], %{{.*}}) {{.*}} -> tensor<8x16xf32>
// CHECK:         "aten::permute"({{.*}} -> tensor<16x16xf32>
// CHECK-NEXT:    %[[M8:.*]] = fsdp.aten "aten::mm"
// CHECK-NEXT:    fsdp.aten "aten::add.Tensor"(%{{.*}}, %[[M8]]) {{.*}} -> tensor<16x16xf32>
// CHECK-NEXT:    %[[M9:.*]] = fsdp.aten "aten::mm"
// CHECK:         fsdp.aten "aten::add.Tensor"(%[[M9]], %{{.*}}) {{.*}} -> tensor<8x16xf32>
// CHECK-NOT:     "aten::addmm"
// CHECK:         fsdp.loss

// The pipeline keeps the folds and lowers them (views of views composed).
// PIPELINE-LABEL: func.func @train_step
// PIPELINE-COUNT-3: "aten::addmm"
// PIPELINE-NOT:     "aten::addmm"
// PIPELINE:         fsdp.loss
