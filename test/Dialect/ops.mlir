// RUN: fsdp-opt %s -split-input-file | FileCheck %s
// RUN: fsdp-opt %s -split-input-file | fsdp-opt -split-input-file | FileCheck %s
// RUN: fsdp-opt %s -split-input-file -mlir-print-op-generic | fsdp-opt -split-input-file | FileCheck %s

// Round trips of every fsdp op and of !fsdp.future, in the custom and the
// generic form.

// CHECK-LABEL: module {
// CHECK-NEXT:    fsdp.unit @root root{{$}}
// CHECK-NEXT:    fsdp.unit @layers.0 class "Block"{{$}}
// CHECK-NEXT:    fsdp.unit @"layers 1"{{$}}
// CHECK-NEXT:    fsdp.unit @head{{$}}
// CHECK-NEXT:  }
fsdp.unit @root root
fsdp.unit @"layers.0" class "Block"
fsdp.unit @"layers 1"
fsdp.unit @head

// -----

// A root unit may also record its class.
// CHECK-LABEL: module {
// CHECK-NEXT:    fsdp.unit @model root class "GPT"{{$}}
fsdp.unit @model root class "GPT"

// -----

// CHECK-LABEL: module {
// CHECK-NEXT:    shard.grid @dp(shape = 4)
// CHECK-NEXT:    shard.grid @hsdp(shape = 2x4)
// CHECK-NEXT:    fsdp.unit @root root
// CHECK-NEXT:    fsdp.param @tok_emb.weight : tensor<50257x768xf32> unit @root{{$}}
// CHECK-NEXT:    fsdp.param @mask : tensor<8x8xi1> unit @root frozen{{$}}
// CHECK-NEXT:    fsdp.param @lm_head.bias : tensor<10xf32> unit @root frozen sharded on @dp axes = [0] padding = 2{{$}}
// CHECK-NEXT:    fsdp.param @fc.weight : tensor<12x32xbf16> unit @root sharded on @dp axes = [0] padding = 0{{$}}
// CHECK-NEXT:    fsdp.param @hybrid : tensor<10x3xf32> unit @root sharded on @hsdp axes = [1] padding = 2{{$}}
// CHECK-NEXT:    fsdp.param @full : tensor<7xf32> unit @root sharded on @hsdp axes = [0, 1] padding = 1{{$}}
// CHECK-NEXT:    fsdp.param @"with space" : tensor<1xf32> unit @root sharded on @dp axes = [0] padding = 3{{$}}
// CHECK-NEXT:  }
shard.grid @dp(shape = 4)
shard.grid @hsdp(shape = 2x4)
fsdp.unit @root root
fsdp.param @"tok_emb.weight" : tensor<50257x768xf32> unit @root
fsdp.param @mask : tensor<8x8xi1> unit @root frozen
fsdp.param @"lm_head.bias" : tensor<10xf32> unit @root frozen
    sharded on @dp axes = [0] padding = 2
fsdp.param @"fc.weight" : tensor<12x32xbf16> unit @root sharded on @dp axes = [0] padding = 0
fsdp.param @hybrid : tensor<10x3xf32> unit @root sharded on @hsdp axes = [1] padding = 2
fsdp.param @full : tensor<7xf32> unit @root sharded on @hsdp axes = [0, 1] padding = 1
fsdp.param @"with space" : tensor<1xf32> unit @root sharded on @dp axes = [0] padding = 3

// -----

// get_param yields the logical type of a replicated parameter and the padded
// shard of a sharded one.
shard.grid @dp(shape = 4)
shard.grid @hsdp(shape = 2x4)
fsdp.unit @root root
fsdp.param @"fc1.weight" : tensor<64x32xf32> unit @root
fsdp.param @w : tensor<10x32xf32> unit @root sharded on @dp axes = [0] padding = 2
fsdp.param @h : tensor<10x3xf32> unit @root sharded on @hsdp axes = [1] padding = 2
fsdp.param @b : tensor<10xbf16> unit @root frozen sharded on @hsdp axes = [0, 1] padding = 6

// CHECK-LABEL: func.func @get_param()
func.func @get_param() -> (tensor<64x32xf32>, tensor<3x32xf32>, tensor<3x3xf32>, tensor<2xbf16>) {
  // CHECK-NEXT: %[[A:.*]] = fsdp.get_param @fc1.weight : tensor<64x32xf32>{{$}}
  // CHECK-NEXT: %[[B:.*]] = fsdp.get_param @w : tensor<3x32xf32>{{$}}
  // CHECK-NEXT: %[[C:.*]] = fsdp.get_param @h : tensor<3x3xf32>{{$}}
  // CHECK-NEXT: %[[D:.*]] = fsdp.get_param @b : tensor<2xbf16>{{$}}
  // CHECK-NEXT: return %[[A]], %[[B]], %[[C]], %[[D]]
  %a = fsdp.get_param @"fc1.weight" : tensor<64x32xf32>
  %b = fsdp.get_param @w : tensor<3x32xf32>
  %c = fsdp.get_param @h : tensor<3x3xf32>
  %d = fsdp.get_param @b : tensor<2xbf16>
  return %a, %b, %c, %d : tensor<64x32xf32>, tensor<3x32xf32>, tensor<3x3xf32>, tensor<2xbf16>
}

// -----

// CHECK-LABEL: func.func @aten(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x32xf32>, %[[W:[^:]*]]: tensor<10x32xf32>, %[[B:[^:]*]]: tensor<10xf32>, %[[S:[^:]*]]: tensor<f32>)
func.func @aten(%x: tensor<8x32xf32>, %w: tensor<10x32xf32>, %b: tensor<10xf32>, %s: tensor<f32>) {
  // Without args: the operands are the argument list.
  // CHECK-NEXT: %[[MUL:.*]] = fsdp.aten "aten::mul.Scalar"(%[[X]], %[[S]]) : (tensor<8x32xf32>, tensor<f32>) -> tensor<8x32xf32>{{$}}
  %0 = fsdp.aten "aten::mul.Scalar" (%x, %s) : (tensor<8x32xf32>, tensor<f32>) -> tensor<8x32xf32>
  // Operand indices and integer literals.
  // CHECK-NEXT: %[[ADDMM:.*]] = fsdp.aten "aten::addmm"(%[[B]], %[[MUL]], %[[W]]) args [0 : index, 1 : index, 2 : index, 1, 1] : (tensor<10xf32>, tensor<8x32xf32>, tensor<10x32xf32>) -> tensor<8x10xf32>{{$}}
  %1 = fsdp.aten "aten::addmm" (%b, %0, %w) args [0 : index, 1 : index, 2 : index, 1 : i64, 1 : i64]
         : (tensor<10xf32>, tensor<8x32xf32>, tensor<10x32xf32>) -> tensor<8x10xf32>
  // A list of operands and a list of literals.
  // CHECK-NEXT: fsdp.aten "aten::cat"(%[[B]], %[[B]]) args {{\[}}[0 : index, 1 : index], 0] : (tensor<10xf32>, tensor<10xf32>) -> tensor<20xf32>{{$}}
  %2 = fsdp.aten "aten::cat" (%b, %b) args [[0 : index, 1 : index], 0] : (tensor<10xf32>, tensor<10xf32>) -> tensor<20xf32>
  // CHECK-NEXT: fsdp.aten "aten::ones"() args {{\[}}[10, 32], f32] : () -> tensor<10x32xf32>{{$}}
  %3 = fsdp.aten "aten::ones" () args [[10, 32], f32] : () -> tensor<10x32xf32>
  // String, float, bool, type (dtype) and unit (None) literals.
  // CHECK-NEXT: fsdp.aten "aten::_to_copy"(%[[X]]) args [0 : index, bf16, unit, "strided", 2.500000e-01, 5.000000e-01 : f32, true] : (tensor<8x32xf32>) -> tensor<8x32xbf16>{{$}}
  %4 = fsdp.aten "aten::_to_copy" (%x) args [0 : index, bf16, unit, "strided", 0.25, 0.5 : f32, true]
         : (tensor<8x32xf32>) -> tensor<8x32xbf16>
  // random, with and without args.
  // CHECK-NEXT: fsdp.aten "aten::dropout"(%[[X]]) args [0 : index, 1.000000e-01, true] random : (tensor<8x32xf32>) -> tensor<8x32xf32>{{$}}
  %5 = fsdp.aten "aten::dropout" (%x) args [0 : index, 0.1 : f64, true] random : (tensor<8x32xf32>) -> tensor<8x32xf32>
  // CHECK-NEXT: fsdp.aten "aten::rand_like"(%[[X]]) random : (tensor<8x32xf32>) -> tensor<8x32xf32>{{$}}
  %6 = fsdp.aten "aten::rand_like" (%x) random : (tensor<8x32xf32>) -> tensor<8x32xf32>
  // Several results.
  // CHECK-NEXT: %{{.*}}:2 = fsdp.aten "aten::max.dim"(%[[X]]) args [0 : index, 1, false] : (tensor<8x32xf32>) -> (tensor<8xf32>, tensor<8xi64>){{$}}
  %7:2 = fsdp.aten "aten::max.dim" (%x) args [0 : index, 1, false] : (tensor<8x32xf32>) -> (tensor<8xf32>, tensor<8xi64>)
  // No results; an empty args list; a dunder name that is not in place;
  // non-tensor operands.
  // CHECK-NEXT: fsdp.aten "aten::_assert_async"(%[[S]]) : (tensor<f32>) -> (){{$}}
  fsdp.aten "aten::_assert_async" (%s) : (tensor<f32>) -> ()
  // CHECK-NEXT: fsdp.aten "prims::empty"() args [] : () -> tensor<1xf32>{{$}}
  %8 = fsdp.aten "prims::empty" () args [] : () -> tensor<1xf32>
  // CHECK-NEXT: fsdp.aten "aten::__and__.Tensor"(%[[B]], %[[B]]) : (tensor<10xf32>, tensor<10xf32>) -> tensor<10xf32>{{$}}
  %9 = fsdp.aten "aten::__and__.Tensor" (%b, %b) : (tensor<10xf32>, tensor<10xf32>) -> tensor<10xf32>
  // CHECK-NEXT: fsdp.aten "aten::sym_size.int"(%[[X]]) args [0 : index, 0] : (tensor<8x32xf32>) -> index{{$}}
  %10 = fsdp.aten "aten::sym_size.int" (%x) args [0 : index, 0] : (tensor<8x32xf32>) -> index
  // CHECK-NEXT: return
  return
}

// -----

// CHECK-LABEL: func.func @cast(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x32xf32>, %[[I:[^:]*]]: tensor<4xi32>)
func.func @cast(%x: tensor<8x32xf32>, %i: tensor<4xi32>) -> (tensor<8x32xbf16>, tensor<4xf16>, tensor<4xi8>, tensor<8x32xf32>) {
  // CHECK-NEXT: %[[A:.*]] = fsdp.cast %[[X]] : tensor<8x32xf32> to tensor<8x32xbf16>{{$}}
  // CHECK-NEXT: %[[B:.*]] = fsdp.cast %[[I]] : tensor<4xi32> to tensor<4xf16>{{$}}
  // CHECK-NEXT: %[[C:.*]] = fsdp.cast %[[B]] : tensor<4xf16> to tensor<4xi8>{{$}}
  // Without -canonicalize an identity cast stays.
  // CHECK-NEXT: %[[D:.*]] = fsdp.cast %[[X]] : tensor<8x32xf32> to tensor<8x32xf32>{{$}}
  // CHECK-NEXT: return %[[A]], %[[B]], %[[C]], %[[D]]
  %a = fsdp.cast %x : tensor<8x32xf32> to tensor<8x32xbf16>
  %b = fsdp.cast %i : tensor<4xi32> to tensor<4xf16>
  %c = fsdp.cast %b : tensor<4xf16> to tensor<4xi8>
  %d = fsdp.cast %x : tensor<8x32xf32> to tensor<8x32xf32>
  return %a, %b, %c, %d : tensor<8x32xbf16>, tensor<4xf16>, tensor<4xi8>, tensor<8x32xf32>
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @w : tensor<10x32xf32> unit @root sharded on @dp axes = [0] padding = 2
fsdp.param @b : tensor<10xf32> unit @root
fsdp.param @frozen : tensor<10xf32> unit @root frozen

// CHECK-LABEL: func.func @loss_and_gradients(
// CHECK-SAME:    %[[L:[^:]*]]: tensor<f32>, %[[GW:[^:]*]]: tensor<3x32xf32>, %[[GB:[^:]*]]: tensor<10xf32>)
func.func @loss_and_gradients(%l: tensor<f32>, %gw: tensor<3x32xf32>, %gb: tensor<10xf32>) -> tensor<f32> {
  // CHECK-NEXT: fsdp.loss %[[L]] : tensor<f32>{{$}}
  // CHECK-NEXT: fsdp.gradients [@w, @b] %[[GW]], %[[GB]] : tensor<3x32xf32>, tensor<10xf32>{{$}}
  // CHECK-NEXT: return %[[L]]
  fsdp.loss %l : tensor<f32>
  fsdp.gradients [@w, @b] %gw, %gb : tensor<3x32xf32>, tensor<10xf32>
  return %l : tensor<f32>
}

// A bf16 loss; gradients for a subset of the parameters.
// CHECK-LABEL: func.func @bf16_loss(
// CHECK-SAME:    %[[L:[^:]*]]: tensor<bf16>, %[[GB:[^:]*]]: tensor<10xf32>)
func.func @bf16_loss(%l: tensor<bf16>, %gb: tensor<10xf32>) {
  // CHECK-NEXT: fsdp.loss %[[L]] : tensor<bf16>{{$}}
  // CHECK-NEXT: fsdp.gradients [@b] %[[GB]] : tensor<10xf32>{{$}}
  fsdp.loss %l : tensor<bf16>
  fsdp.gradients [@b] %gb : tensor<10xf32>
  return
}

// -----

shard.grid @dp(shape = 4)
shard.grid @hsdp(shape = 2x4)
fsdp.unit @root root
fsdp.unit @"layers.0" class "Block"

// CHECK-LABEL: func.func @all_gather(
// CHECK-SAME:    %[[W:[^:]*]]: tensor<3x32xf32>, %[[B:[^:]*]]: tensor<3xf32>, %[[E:[^:]*]]: tensor<2x8xbf16>)
func.func @all_gather(%w: tensor<3x32xf32>, %b: tensor<3xf32>, %e: tensor<2x8xbf16>) {
  // Mixed precision (f32 -> bf16 in copy-in), a bucket of two, unit and prefetch.
  // CHECK-NEXT: %[[F0:.*]] = fsdp.all_gather_start %[[W]], %[[B]] on @dp axes = [0] unit @layers.0 prefetch 1 : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>{{$}}
  // CHECK-NEXT: %{{.*}}:2 = fsdp.wait %[[F0]] : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>{{$}}
  %f0 = fsdp.all_gather_start %w, %b on @dp axes = [0] unit @"layers.0" prefetch 1
          : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  %w0, %b0 = fsdp.wait %f0 : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  // No cast, no unit.
  // CHECK-NEXT: %[[F1:.*]] = fsdp.all_gather_start %[[W]] on @dp axes = [0] : tensor<3x32xf32> -> !fsdp.future<tensor<12x32xf32>>{{$}}
  // CHECK-NEXT: %{{.*}} = fsdp.wait %[[F1]] : !fsdp.future<tensor<12x32xf32>>{{$}}
  %f1 = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3x32xf32> -> !fsdp.future<tensor<12x32xf32>>
  %w1 = fsdp.wait %f1 : !fsdp.future<tensor<12x32xf32>>
  // Gathered straight into the results.
  // CHECK-NEXT: %[[FI:.*]] = fsdp.all_gather_start %[[W]] on @dp axes = [0] into_results : tensor<3x32xf32> -> !fsdp.future<tensor<10x32xf32>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[FI]] : !fsdp.future<tensor<10x32xf32>>{{$}}
  %fi = fsdp.all_gather_start %w on @dp axes = [0] into_results : tensor<3x32xf32> -> !fsdp.future<tensor<10x32xf32>>
  %wi = fsdp.wait %fi : !fsdp.future<tensor<10x32xf32>>
  // A unit without prefetch; a deeper prefetch; a hybrid grid axis.
  // CHECK-NEXT: %[[F2:.*]] = fsdp.all_gather_start %[[E]] on @hsdp axes = [1] unit @root : tensor<2x8xbf16> -> !fsdp.future<tensor<5x8xbf16>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[F2]] : !fsdp.future<tensor<5x8xbf16>>{{$}}
  %f2 = fsdp.all_gather_start %e on @hsdp axes = [1] unit @root : tensor<2x8xbf16> -> !fsdp.future<tensor<5x8xbf16>>
  %e2 = fsdp.wait %f2 : !fsdp.future<tensor<5x8xbf16>>
  // CHECK-NEXT: %[[F3:.*]] = fsdp.all_gather_start %[[E]], %[[B]] on @hsdp axes = [0, 1] unit @layers.0 prefetch 3 : tensor<2x8xbf16>, tensor<3xf32> -> !fsdp.future<tensor<16x8xf32>, tensor<24xf32>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[F3]] : !fsdp.future<tensor<16x8xf32>, tensor<24xf32>>{{$}}
  %f3 = fsdp.all_gather_start %e, %b on @hsdp axes = [0, 1] unit @"layers.0" prefetch 3
          : tensor<2x8xbf16>, tensor<3xf32> -> !fsdp.future<tensor<16x8xf32>, tensor<24xf32>>
  %e3:2 = fsdp.wait %f3 : !fsdp.future<tensor<16x8xf32>, tensor<24xf32>>
  return
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root

// CHECK-LABEL: func.func @reduce_scatter(
// CHECK-SAME:    %[[G:[^:]*]]: tensor<10x32xbf16>, %[[H:[^:]*]]: tensor<10xf16>)
func.func @reduce_scatter(%g: tensor<10x32xbf16>, %h: tensor<10xf16>) {
  // CHECK-NEXT: %[[F0:.*]] = fsdp.reduce_scatter_start %[[G]] on @dp axes = [0] reduction = average reduce_dtype = f32 : tensor<10x32xbf16> -> !fsdp.future<tensor<3x32xf32>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[F0]] : !fsdp.future<tensor<3x32xf32>>{{$}}
  %f0 = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32
          : tensor<10x32xbf16> -> !fsdp.future<tensor<3x32xf32>>
  %s0 = fsdp.wait %f0 : !fsdp.future<tensor<3x32xf32>>
  // fp16: sum with pre- and post-divide, and a bucket of two.
  // CHECK-NEXT: %[[F1:.*]] = fsdp.reduce_scatter_start %[[H]], %[[G]] on @dp axes = [0] reduction = sum reduce_dtype = f16 pre_divide = 2.000000e+00 post_divide = 2.000000e+00 unit @root : tensor<10xf16>, tensor<10x32xbf16> -> !fsdp.future<tensor<3xf16>, tensor<3x32xbf16>>{{$}}
  // CHECK-NEXT: %{{.*}}:2 = fsdp.wait %[[F1]] : !fsdp.future<tensor<3xf16>, tensor<3x32xbf16>>{{$}}
  %f1 = fsdp.reduce_scatter_start %h, %g on @dp axes = [0] reduction = sum reduce_dtype = f16
          pre_divide = 2.0 post_divide = 2.0 unit @root
          : tensor<10xf16>, tensor<10x32xbf16> -> !fsdp.future<tensor<3xf16>, tensor<3x32xbf16>>
  %s1:2 = fsdp.wait %f1 : !fsdp.future<tensor<3xf16>, tensor<3x32xbf16>>
  // Only one divide factor.
  // CHECK-NEXT: %[[F2:.*]] = fsdp.reduce_scatter_start %[[H]] on @dp axes = [0] reduction = sum reduce_dtype = f32 post_divide = 4.000000e+00 : tensor<10xf16> -> !fsdp.future<tensor<3xf16>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[F2]] : !fsdp.future<tensor<3xf16>>{{$}}
  %f2 = fsdp.reduce_scatter_start %h on @dp axes = [0] reduction = sum reduce_dtype = f32 post_divide = 4.0
          : tensor<10xf16> -> !fsdp.future<tensor<3xf16>>
  %s2 = fsdp.wait %f2 : !fsdp.future<tensor<3xf16>>
  return
}

// -----

shard.grid @hsdp(shape = 2x4)
fsdp.unit @root root

// CHECK-LABEL: func.func @all_reduce(
// CHECK-SAME:    %[[G:[^:]*]]: tensor<3x32xf32>, %[[N:[^:]*]]: tensor<f32>)
func.func @all_reduce(%g: tensor<3x32xf32>, %n: tensor<f32>) {
  // CHECK-NEXT: %[[F0:.*]] = fsdp.all_reduce_start %[[N]] on @hsdp axes = [0, 1] reduction = max reduce_dtype = f32 : tensor<f32> -> !fsdp.future<tensor<f32>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[F0]] : !fsdp.future<tensor<f32>>{{$}}
  %f0 = fsdp.all_reduce_start %n on @hsdp axes = [0, 1] reduction = max reduce_dtype = f32
          : tensor<f32> -> !fsdp.future<tensor<f32>>
  %m = fsdp.wait %f0 : !fsdp.future<tensor<f32>>
  // CHECK-NEXT: %[[F1:.*]] = fsdp.all_reduce_start %[[G]], %[[N]] on @hsdp axes = [0] reduction = sum reduce_dtype = f16 pre_divide = 2.000000e+00 post_divide = 1.000000e+00 unit @root : tensor<3x32xf32>, tensor<f32> -> !fsdp.future<tensor<3x32xbf16>, tensor<f32>>{{$}}
  // CHECK-NEXT: %{{.*}}:2 = fsdp.wait %[[F1]] : !fsdp.future<tensor<3x32xbf16>, tensor<f32>>{{$}}
  %f1 = fsdp.all_reduce_start %g, %n on @hsdp axes = [0] reduction = sum reduce_dtype = f16
          pre_divide = 2.0 post_divide = 1.0 unit @root
          : tensor<3x32xf32>, tensor<f32> -> !fsdp.future<tensor<3x32xbf16>, tensor<f32>>
  %s:2 = fsdp.wait %f1 : !fsdp.future<tensor<3x32xbf16>, tensor<f32>>
  // CHECK-NEXT: %[[F2:.*]] = fsdp.all_reduce_start %[[G]] on @hsdp axes = [0] reduction = average reduce_dtype = bf16 : tensor<3x32xf32> -> !fsdp.future<tensor<3x32xf32>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[F2]]
  %f2 = fsdp.all_reduce_start %g on @hsdp axes = [0] reduction = average reduce_dtype = bf16
          : tensor<3x32xf32> -> !fsdp.future<tensor<3x32xf32>>
  %a = fsdp.wait %f2 : !fsdp.future<tensor<3x32xf32>>
  // CHECK-NEXT: %[[F3:.*]] = fsdp.all_reduce_start %[[N]] on @hsdp axes = [1] reduction = min reduce_dtype = f32 : tensor<f32> -> !fsdp.future<tensor<f32>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[F3]]
  %f3 = fsdp.all_reduce_start %n on @hsdp axes = [1] reduction = min reduce_dtype = f32
          : tensor<f32> -> !fsdp.future<tensor<f32>>
  %b = fsdp.wait %f3 : !fsdp.future<tensor<f32>>
  // CHECK-NEXT: %[[F4:.*]] = fsdp.all_reduce_start %[[N]] on @hsdp axes = [1] reduction = product reduce_dtype = f64 : tensor<f32> -> !fsdp.future<tensor<f32>>{{$}}
  // CHECK-NEXT: fsdp.wait %[[F4]]
  %f4 = fsdp.all_reduce_start %n on @hsdp axes = [1] reduction = product reduce_dtype = f64
          : tensor<f32> -> !fsdp.future<tensor<f32>>
  %c = fsdp.wait %f4 : !fsdp.future<tensor<f32>>
  return
}

// -----

// CHECK-LABEL: func.func @data_parallel_sum(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<16xbf16>)
func.func @data_parallel_sum(%x: tensor<16xbf16>) -> tensor<16xbf16> {
  // CHECK-NEXT: %[[S:.*]] = fsdp.data_parallel_sum %[[X]] : tensor<16xbf16>{{$}}
  %s = fsdp.data_parallel_sum %x : tensor<16xbf16>
  return %s : tensor<16xbf16>
}

// -----

shard.grid @dp(shape = 4)

// Single and multiple results of fsdp.wait, used by name.
// CHECK-LABEL: func.func @wait(
// CHECK-SAME:    %[[W:[^:]*]]: tensor<3x32xf32>, %[[B:[^:]*]]: tensor<3xf32>)
func.func @wait(%w: tensor<3x32xf32>, %b: tensor<3xf32>) -> (tensor<10x32xf32>, tensor<10xf32>, tensor<12xf32>) {
  // CHECK-NEXT: %[[F0:.*]] = fsdp.all_gather_start %[[W]], %[[B]] on @dp axes = [0] : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xf32>, tensor<10xf32>>{{$}}
  // CHECK-NEXT: %[[R0:.*]]:2 = fsdp.wait %[[F0]] : !fsdp.future<tensor<10x32xf32>, tensor<10xf32>>{{$}}
  // CHECK-NEXT: %[[F1:.*]] = fsdp.all_gather_start %[[B]] on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>{{$}}
  // CHECK-NEXT: %[[R1:.*]] = fsdp.wait %[[F1]] : !fsdp.future<tensor<12xf32>>{{$}}
  // CHECK-NEXT: return %[[R0]]#0, %[[R0]]#1, %[[R1]] :
  %f0 = fsdp.all_gather_start %w, %b on @dp axes = [0]
          : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xf32>, tensor<10xf32>>
  %wf, %bf = fsdp.wait %f0 : !fsdp.future<tensor<10x32xf32>, tensor<10xf32>>
  %f1 = fsdp.all_gather_start %b on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %bg = fsdp.wait %f1 : !fsdp.future<tensor<12xf32>>
  return %wf, %bf, %bg : tensor<10x32xf32>, tensor<10xf32>, tensor<12xf32>
}

// -----

shard.grid @dp(shape = 4)
fsdp.unit @root root

// CHECK-LABEL: func.func @reshard(
// CHECK-SAME:    %[[W:[^:]*]]: tensor<3x32xf32>, %[[B:[^:]*]]: tensor<3xf32>, %[[X:[^:]*]]: tensor<8x32xbf16>)
func.func @reshard(%w: tensor<3x32xf32>, %b: tensor<3xf32>, %x: tensor<8x32xbf16>) -> tensor<8x10xbf16> {
  // CHECK-NEXT: %[[F:.*]] = fsdp.all_gather_start %[[W]], %[[B]] on @dp axes = [0] unit @root : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>{{$}}
  // CHECK-NEXT: %[[G:.*]]:2 = fsdp.wait %[[F]] : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>{{$}}
  // CHECK-NEXT: %[[Y:.*]] = fsdp.aten "aten::addmm"(%[[G]]#1, %[[X]], %[[G]]#0)
  // CHECK-NEXT: fsdp.reshard %[[G]]#0 : tensor<10x32xbf16>{{$}}
  // CHECK-NEXT: fsdp.reshard %[[G]]#1 : tensor<10xbf16>{{$}}
  // CHECK-NEXT: %[[F2:.*]] = fsdp.all_gather_start %[[W]], %[[B]] on @dp axes = [0] : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>{{$}}
  // CHECK-NEXT: %[[G2:.*]]:2 = fsdp.wait %[[F2]]
  // CHECK-NEXT: fsdp.reshard %[[G2]]#0, %[[G2]]#1 : tensor<10x32xbf16>, tensor<10xbf16>{{$}}
  // CHECK-NEXT: return %[[Y]]
  %f = fsdp.all_gather_start %w, %b on @dp axes = [0] unit @root
         : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  %wf, %bf = fsdp.wait %f : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  %y = fsdp.aten "aten::addmm" (%bf, %x, %wf) args [0 : index, 1 : index, 2 : index, 1 : i64, 1 : i64]
         : (tensor<10xbf16>, tensor<8x32xbf16>, tensor<10x32xbf16>) -> tensor<8x10xbf16>
  fsdp.reshard %wf : tensor<10x32xbf16>
  fsdp.reshard %bf : tensor<10xbf16>
  %f2 = fsdp.all_gather_start %w, %b on @dp axes = [0]
          : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  %wf2, %bf2 = fsdp.wait %f2 : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  fsdp.reshard %wf2, %bf2 : tensor<10x32xbf16>, tensor<10xbf16>
  return %y : tensor<8x10xbf16>
}

// -----

// A gathered buffer may be read by a collective that has been waited for
// before the free.
shard.grid @dp(shape = 4)

// CHECK-LABEL: func.func @reshard_after_collective(
func.func @reshard_after_collective(%w: tensor<3xf32>) -> tensor<12xf32> {
  // CHECK:      %[[G:.*]] = fsdp.wait
  // CHECK-NEXT: %[[R:.*]] = fsdp.all_reduce_start %[[G]] on @dp axes = [0]
  // CHECK-NEXT: %[[S:.*]] = fsdp.wait %[[R]]
  // CHECK-NEXT: fsdp.reshard %[[G]] : tensor<12xf32>{{$}}
  // CHECK-NEXT: return %[[S]]
  %f = fsdp.all_gather_start %w on @dp axes = [0] : tensor<3xf32> -> !fsdp.future<tensor<12xf32>>
  %g = fsdp.wait %f : !fsdp.future<tensor<12xf32>>
  %r = fsdp.all_reduce_start %g on @dp axes = [0] reduction = sum reduce_dtype = f32
         : tensor<12xf32> -> !fsdp.future<tensor<12xf32>>
  %s = fsdp.wait %r : !fsdp.future<tensor<12xf32>>
  fsdp.reshard %g : tensor<12xf32>
  return %s : tensor<12xf32>
}

// -----

shard.grid @dp(shape = 4)
shard.grid @grid2d(shape = 2x2)

// CHECK-LABEL: func.func @all_slice(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<10x32xbf16>, %[[V:[^:]*]]: tensor<7xf32>)
func.func @all_slice(%x: tensor<10x32xbf16>, %v: tensor<7xf32>) -> (tensor<5x32xbf16>, tensor<2xf32>, tensor<3x32xbf16>) {
  // CHECK-NEXT: %[[A:.*]] = fsdp.all_slice %[[X]] on @grid2d axes = [1] : tensor<10x32xbf16> -> tensor<5x32xbf16>{{$}}
  // CHECK-NEXT: %[[B:.*]] = fsdp.all_slice %[[V]] on @grid2d axes = [0, 1] : tensor<7xf32> -> tensor<2xf32>{{$}}
  // CHECK-NEXT: %[[C:.*]] = fsdp.all_slice %[[X]] on @dp axes = [0] : tensor<10x32xbf16> -> tensor<3x32xbf16>{{$}}
  // CHECK-NEXT: return %[[A]], %[[B]], %[[C]]
  %a = fsdp.all_slice %x on @grid2d axes = [1] : tensor<10x32xbf16> -> tensor<5x32xbf16>
  %b = fsdp.all_slice %v on @grid2d axes = [0, 1] : tensor<7xf32> -> tensor<2xf32>
  %c = fsdp.all_slice %x on @dp axes = [0] : tensor<10x32xbf16> -> tensor<3x32xbf16>
  return %a, %b, %c : tensor<5x32xbf16>, tensor<2xf32>, tensor<3x32xbf16>
}

// -----

// The future type on its own.
// CHECK-LABEL: func.func private @future_type(!fsdp.future<tensor<128x64xbf16>, tensor<64xbf16>>, !fsdp.future<tensor<f32>>) -> !fsdp.future<tensor<1x2x3xi8>>{{$}}
func.func private @future_type(!fsdp.future<tensor<128x64xbf16>, tensor<64xbf16>>, !fsdp.future<tensor<f32>>) -> !fsdp.future<tensor<1x2x3xi8>>

// -----

// A complete training step.
shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.unit @"layers.0" class "Block"
fsdp.param @w : tensor<10x32xf32> unit @"layers.0" sharded on @dp axes = [0] padding = 2
fsdp.param @b : tensor<10xf32> unit @root frozen sharded on @dp axes = [0] padding = 2

// CHECK-LABEL: func.func @step(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x32xf32>) -> tensor<f32>
// CHECK-NEXT:    %[[W:.*]] = fsdp.get_param @w : tensor<3x32xf32>
// CHECK-NEXT:    %[[B:.*]] = fsdp.get_param @b : tensor<3xf32>
// CHECK-NEXT:    %[[F:.*]] = fsdp.all_gather_start %[[W]], %[[B]] on @dp axes = [0] unit @layers.0 prefetch 1 : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
// CHECK-NEXT:    %[[G:.*]]:2 = fsdp.wait %[[F]] : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
// CHECK-NEXT:    %[[XB:.*]] = fsdp.cast %[[X]] : tensor<8x32xf32> to tensor<8x32xbf16>
// CHECK-NEXT:    %[[Y:.*]] = fsdp.aten "aten::addmm"(%[[G]]#1, %[[XB]], %[[G]]#0) args [0 : index, 1 : index, 2 : index, 1, 1] : (tensor<10xbf16>, tensor<8x32xbf16>, tensor<10x32xbf16>) -> tensor<8x10xbf16>
// CHECK-NEXT:    fsdp.reshard %[[G]]#0, %[[G]]#1 : tensor<10x32xbf16>, tensor<10xbf16>
// CHECK-NEXT:    %[[L:.*]] = fsdp.aten "aten::sum"(%[[Y]]) : (tensor<8x10xbf16>) -> tensor<f32>
// CHECK-NEXT:    fsdp.loss %[[L]] : tensor<f32>
// CHECK-NEXT:    %[[GR:.*]] = fsdp.aten "aten::ones"() args {{\[}}[10, 32], f32] : () -> tensor<10x32xbf16>
// CHECK-NEXT:    %[[RS:.*]] = fsdp.reduce_scatter_start %[[GR]] on @dp axes = [0] reduction = average reduce_dtype = f32 : tensor<10x32xbf16> -> !fsdp.future<tensor<3x32xf32>>
// CHECK-NEXT:    %[[GS:.*]] = fsdp.wait %[[RS]] : !fsdp.future<tensor<3x32xf32>>
// CHECK-NEXT:    fsdp.gradients [@w] %[[GS]] : tensor<3x32xf32>
// CHECK-NEXT:    return %[[L]] : tensor<f32>
func.func @step(%x: tensor<8x32xf32>) -> tensor<f32> {
  %w = fsdp.get_param @w : tensor<3x32xf32>
  %b = fsdp.get_param @b : tensor<3xf32>
  %f = fsdp.all_gather_start %w, %b on @dp axes = [0] unit @"layers.0" prefetch 1 : tensor<3x32xf32>, tensor<3xf32> -> !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  %wf, %bf = fsdp.wait %f : !fsdp.future<tensor<10x32xbf16>, tensor<10xbf16>>
  %xb = fsdp.cast %x : tensor<8x32xf32> to tensor<8x32xbf16>
  %y = fsdp.aten "aten::addmm" (%bf, %xb, %wf) args [0 : index, 1 : index, 2 : index, 1 : i64, 1 : i64] : (tensor<10xbf16>, tensor<8x32xbf16>, tensor<10x32xbf16>) -> tensor<8x10xbf16>
  fsdp.reshard %wf, %bf : tensor<10x32xbf16>, tensor<10xbf16>
  %l = fsdp.aten "aten::sum" (%y) : (tensor<8x10xbf16>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %g = fsdp.aten "aten::ones" () args [[10, 32], f32] : () -> tensor<10x32xbf16>
  %r = fsdp.reduce_scatter_start %g on @dp axes = [0] reduction = average reduce_dtype = f32 : tensor<10x32xbf16> -> !fsdp.future<tensor<3x32xf32>>
  %gs = fsdp.wait %r : !fsdp.future<tensor<3x32xf32>>
  fsdp.gradients [@w] %gs : tensor<3x32xf32>
  return %l : tensor<f32>
}

// -----

// Tied parameters, buffers, and the module that issued each ATen call.
// CHECK-LABEL: module {
// CHECK-NEXT:    shard.grid @dp(shape = 4)
// CHECK-NEXT:    fsdp.unit @root root
// CHECK-NEXT:    fsdp.param @tok_emb.weight : tensor<11x4xf32> unit @root tied ["lm_head.weight"]{{$}}
// CHECK-NEXT:    fsdp.param @pos : tensor<2x4xf32> unit @root frozen tied ["a.pos", "b.pos"] sharded on @dp axes = [0] padding = 2{{$}}
// CHECK-NEXT:    fsdp.buffer @rope.inv_freq : tensor<2xf32>{{$}}
// CHECK-LABEL:   func.func @uses
// CHECK-NEXT:    %[[F:.*]] = fsdp.get_buffer @rope.inv_freq : tensor<2xf32>
// CHECK-NEXT:    %{{.*}} = fsdp.aten "aten::neg"(%[[F]]) module "layers.0.attn" : (tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %{{.*}} = fsdp.aten "aten::rand"() args {{\[}}[2], f32] random module "" : () -> tensor<2xf32>
// CHECK-NEXT:    %{{.*}} = fsdp.aten "aten::relu"(%{{.*}}) module "layers.0.mlp" checkpoint 3 : (tensor<2xf32>) -> tensor<2xf32>
shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @"tok_emb.weight" : tensor<11x4xf32> unit @root tied ["lm_head.weight"]
fsdp.param @pos : tensor<2x4xf32> unit @root frozen tied ["a.pos", "b.pos"] sharded on @dp axes = [0] padding = 2
fsdp.buffer @"rope.inv_freq" : tensor<2xf32>
func.func @uses() -> (tensor<2xf32>, tensor<2xf32>) {
  %f = fsdp.get_buffer @"rope.inv_freq" : tensor<2xf32>
  %n = fsdp.aten "aten::neg" (%f) module "layers.0.attn" : (tensor<2xf32>) -> tensor<2xf32>
  %r = fsdp.aten "aten::rand" () args [[2], f32] random module "" : () -> tensor<2xf32>
  %c = fsdp.aten "aten::relu" (%n) module "layers.0.mlp" checkpoint 3 : (tensor<2xf32>) -> tensor<2xf32>
  return %c, %r : tensor<2xf32>, tensor<2xf32>
}

// -----

// Gradient accumulation: an unreduced microbatch and the synchronized step.
// CHECK-LABEL: func.func @no_sync
// CHECK:         fsdp.gradients [@w] %{{.*}} unreduced : tensor<10x4xf32>
// CHECK-LABEL: func.func @sync
// CHECK:         %{{.*}} = fsdp.get_accumulated_grad @w : tensor<10x4xf32>
shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @w : tensor<10x4xf32> unit @root sharded on @dp axes = [0] padding = 2
func.func @no_sync(%l: tensor<f32>, %g: tensor<10x4xf32>) {
  fsdp.loss %l : tensor<f32>
  fsdp.gradients [@w] %g unreduced : tensor<10x4xf32>
  return
}
func.func @sync(%l: tensor<f32>, %s: tensor<3x4xf32>) -> tensor<10x4xf32> {
  fsdp.loss %l : tensor<f32>
  %acc = fsdp.get_accumulated_grad @w : tensor<10x4xf32>
  fsdp.gradients [@w] %s : tensor<3x4xf32>
  return %acc : tensor<10x4xf32>
}

// -----

// The discardable attributes capture and the passes write.
// CHECK-LABEL: module attributes {fsdp.mixed_precision = {cast_forward_inputs = true, output_dtype = f32, param_dtype = bf16, reduce_dtype = f32}}
// CHECK: func.func private @f() attributes {fsdp.collective_count = 2 : i64, fsdp.collective_hash = "00ff", fsdp.comm = {total_bytes = 8 : i64}, fsdp.memory = {peak = 1 : i64}}
module attributes {fsdp.mixed_precision = {param_dtype = bf16, reduce_dtype = f32, output_dtype = f32, cast_forward_inputs = true}} {
  func.func private @f() attributes {fsdp.collective_count = 2, fsdp.collective_hash = "00ff", fsdp.comm = {total_bytes = 8}, fsdp.memory = {peak = 1}}
}

// -----

// CHECK-LABEL: func.func @release(
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x4xf32>)
func.func @release(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // CHECK-NEXT: %[[Y:.*]] = fsdp.aten "aten::relu"(%[[X]])
  // CHECK-NEXT: %[[V:.*]] = fsdp.aten "aten::t"(%[[Y]])
  // CHECK-NEXT: fsdp.release %[[X]], %[[Y]] : tensor<8x4xf32>, tensor<8x4xf32>{{$}}
  // CHECK-NEXT: %[[Z:.*]] = fsdp.aten "aten::t"(%[[V]])
  // CHECK-NEXT: fsdp.release %[[V]] : tensor<4x8xf32>{{$}}
  // CHECK-NEXT: return %[[Z]]
  %y = fsdp.aten "aten::relu" (%x) : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %v = fsdp.aten "aten::t" (%y) : (tensor<8x4xf32>) -> tensor<4x8xf32>
  fsdp.release %x, %y : tensor<8x4xf32>, tensor<8x4xf32>
  %z = fsdp.aten "aten::t" (%v) : (tensor<4x8xf32>) -> tensor<8x4xf32>
  fsdp.release %v : tensor<4x8xf32>
  return %z : tensor<8x4xf32>
}

// -----

// CHECK-LABEL: func.func @pointwise
// CHECK-SAME:    %[[X:[^:]*]]: tensor<8x64xbf16>, %[[M:[^:]*]]: tensor<8x1xbf16>, %[[W:[^:]*]]: tensor<64xbf16>)
func.func @pointwise(%x: tensor<8x64xbf16>, %ms: tensor<8x1xbf16>, %w: tensor<64xbf16>) -> tensor<8x64xbf16> {
  // CHECK-NEXT: %[[R:.*]]:2 = fsdp.pointwise(%[[X]], %[[M]], %[[W]]) module "norm" : (tensor<8x64xbf16>, tensor<8x1xbf16>, tensor<64xbf16>) -> (tensor<8x64xbf16>, tensor<8x64xbf16>) {
  // CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<8x64xbf16>, %[[B:.*]]: tensor<8x1xbf16>, %[[C:.*]]: tensor<64xbf16>):
  // CHECK-NEXT:   %[[S:.*]] = fsdp.aten "aten::rsqrt"(%[[B]])
  // CHECK-NEXT:   %[[N:.*]] = fsdp.aten "aten::mul.Tensor"(%[[A]], %[[S]])
  // CHECK-NEXT:   %[[Y:.*]] = fsdp.aten "aten::mul.Tensor"(%[[N]], %[[C]])
  // CHECK-NEXT:   fsdp.yield %[[N]], %[[Y]] : tensor<8x64xbf16>, tensor<8x64xbf16>
  // CHECK-NEXT: }
  // CHECK-NEXT: return %[[R]]#1
  %n, %y = fsdp.pointwise (%x, %ms, %w) module "norm"
      : (tensor<8x64xbf16>, tensor<8x1xbf16>, tensor<64xbf16>) -> (tensor<8x64xbf16>, tensor<8x64xbf16>) {
  ^bb0(%a: tensor<8x64xbf16>, %b: tensor<8x1xbf16>, %c: tensor<64xbf16>):
    %r = fsdp.aten "aten::rsqrt"(%b) : (tensor<8x1xbf16>) -> tensor<8x1xbf16>
    %m = fsdp.aten "aten::mul.Tensor"(%a, %r) : (tensor<8x64xbf16>, tensor<8x1xbf16>) -> tensor<8x64xbf16>
    %s = fsdp.aten "aten::mul.Tensor"(%m, %c) : (tensor<8x64xbf16>, tensor<64xbf16>) -> tensor<8x64xbf16>
    fsdp.yield %m, %s : tensor<8x64xbf16>, tensor<8x64xbf16>
  }
  return %y : tensor<8x64xbf16>
}
