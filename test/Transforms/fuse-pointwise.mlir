// RUN: fsdp-opt %s -split-input-file --fsdp-fuse-pointwise | FileCheck %s

// RMSNorm's tail and SwiGLU's product: the rsqrt is read later (by the
// return), so it stays an output of its own [8, 1] kernel; the products
// become one kernel with the weight broadcast along rows.
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @norm_and_swiglu
func.func @norm_and_swiglu(%x: tensor<8x64xbf16>, %ms: tensor<8x1xbf16>, %w: tensor<64xbf16>,
                           %a: tensor<8x64xbf16>, %b: tensor<8x64xbf16>) -> (tensor<8x64xbf16>, tensor<8x1xbf16>, tensor<8x64xbf16>) {
  %xd = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %msd = fsdp.aten "aten::clone"(%ms) args [0 : index, "contiguous_format"] : (tensor<8x1xbf16>) -> tensor<8x1xbf16>
  %wd = fsdp.aten "aten::clone"(%w) args [0 : index, "contiguous_format"] : (tensor<64xbf16>) -> tensor<64xbf16>
  %e = fsdp.aten "aten::add.Tensor"(%msd) args [0 : index, 1.0e-05, 1] : (tensor<8x1xbf16>) -> tensor<8x1xbf16>
  %r = fsdp.aten "aten::rsqrt"(%e) : (tensor<8x1xbf16>) -> tensor<8x1xbf16>
  %n = fsdp.aten "aten::mul.Tensor"(%xd, %r) : (tensor<8x64xbf16>, tensor<8x1xbf16>) -> tensor<8x64xbf16>
  %y = fsdp.aten "aten::mul.Tensor"(%n, %wd) : (tensor<8x64xbf16>, tensor<64xbf16>) -> tensor<8x64xbf16>
  %ad = fsdp.aten "aten::clone"(%a) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %bd = fsdp.aten "aten::clone"(%b) args [0 : index, "contiguous_format"] : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %s = fsdp.aten "aten::silu"(%ad) : (tensor<8x64xbf16>) -> tensor<8x64xbf16>
  %g = fsdp.aten "aten::mul.Tensor"(%s, %bd) : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16>
  return %y, %r, %g : tensor<8x64xbf16>, tensor<8x1xbf16>, tensor<8x64xbf16>
}
}
// The batch's layout is the caller's: contiguous clones of it are dense.
// CHECK:      %[[XD:.*]] = fsdp.aten "aten::clone"(%arg0)
// CHECK:      %[[MSD:.*]] = fsdp.aten "aten::clone"(%arg1)
// CHECK:      %[[WD:.*]] = fsdp.aten "aten::clone"(%arg2)
// CHECK:      %[[R:.*]] = fsdp.pointwise(%[[MSD]]) : (tensor<8x1xbf16>) -> tensor<8x1xbf16> {
// CHECK-NEXT: ^bb0(%[[MS:.*]]: tensor<8x1xbf16>):
// CHECK-NEXT:   %[[E:.*]] = fsdp.aten "aten::add.Tensor"(%[[MS]]) args [0 : index, 1.000000e-05, 1]
// CHECK-NEXT:   %[[RS:.*]] = fsdp.aten "aten::rsqrt"(%[[E]])
// CHECK-NEXT:   fsdp.yield %[[RS]] : tensor<8x1xbf16>
// CHECK:      %[[Y:.*]] = fsdp.pointwise(%[[XD]], %[[R]], %[[WD]]) : (tensor<8x64xbf16>, tensor<8x1xbf16>, tensor<64xbf16>) -> tensor<8x64xbf16>
// CHECK:        fsdp.aten "aten::mul.Tensor"
// CHECK:        fsdp.aten "aten::mul.Tensor"
// CHECK:      %[[G:.*]] = fsdp.pointwise(%{{.*}}, %{{.*}}) : (tensor<8x64xbf16>, tensor<8x64xbf16>) -> tensor<8x64xbf16>
// CHECK:        fsdp.aten "aten::silu"
// CHECK:        fsdp.aten "aten::mul.Tensor"
// CHECK:      return %[[Y]], %[[R]], %[[G]]

// -----

// Not fused: a kernel that would lay its result out unlike eager (the
// neg reads a transposed product, so the kernel would order the result's
// dimensions by it; eager's add orders them by its first, row-major,
// operand and makes a row-major result); a chain whose later call reads a
// value made after the reshard of an earlier call's operand (the earlier
// call cannot move below the reshard, the later one not above its
// operand); different element types; a reduction between. A call whose
// operands exist earlier moves up instead: the sigmoid joins the product
// ahead of the reshard.
module attributes {fsdp.device = "cuda"} {
fsdp.unit @root root
fsdp.param @w : tensor<8x8xf32> unit @root sharded on @g axes = [0] padding = 0
shard.grid @g(shape = 1)
// CHECK-LABEL: func.func @refused
func.func @refused(%x: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf16>, tensor<8x8xf32>, tensor<8x8xf32>) {
  %x0 = fsdp.aten "aten::mm"(%x, %x) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %t = fsdp.aten "aten::permute"(%x0) args [0 : index, [1, 0]] : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %a = fsdp.aten "aten::neg"(%t) : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = fsdp.aten "aten::mm"(%x, %x) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %b = fsdp.aten "aten::add.Tensor"(%y, %a) args [0 : index, 1 : index, 1] : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %s = fsdp.get_param @w : tensor<8x8xf32>
  %f = fsdp.all_gather_start %s on @g axes = [0] : tensor<8x8xf32> -> !fsdp.future<tensor<8x8xf32>>
  %w = fsdp.wait %f : !fsdp.future<tensor<8x8xf32>>
  %c = fsdp.aten "aten::mul.Tensor"(%x0, %w) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  fsdp.reshard %w : tensor<8x8xf32>
  %d = fsdp.aten "aten::sigmoid"(%c) : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %z = fsdp.aten "aten::mm"(%x, %x) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %k = fsdp.aten "aten::add.Tensor"(%d, %z) args [0 : index, 1 : index, 1] : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %h = fsdp.cast %x0 : tensor<8x8xf32> to tensor<8x8xf16>
  %h2 = fsdp.aten "aten::neg"(%h) : (tensor<8x8xf16>) -> tensor<8x8xf16>
  %m = fsdp.aten "aten::sum.dim_IntList"(%x0) args [0 : index, [1], true, unit] : (tensor<8x8xf32>) -> tensor<8x1xf32>
  %e = fsdp.aten "aten::div.Tensor"(%x0, %m) : (tensor<8x8xf32>, tensor<8x1xf32>) -> tensor<8x8xf32>
  return %b, %d, %h2, %e, %k : tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf16>, tensor<8x8xf32>, tensor<8x8xf32>
}
}
// CHECK-NOT: fsdp.pointwise
// CHECK:     fsdp.aten "aten::neg"
// CHECK:     fsdp.aten "aten::add.Tensor"
// CHECK:     %[[D:.*]] = fsdp.pointwise
// CHECK:       fsdp.aten "aten::mul.Tensor"
// CHECK:       fsdp.aten "aten::sigmoid"
// CHECK:       fsdp.yield
// CHECK:     fsdp.reshard
// CHECK:     %[[Z:.*]] = fsdp.aten "aten::mm"
// CHECK:     fsdp.aten "aten::add.Tensor"(%[[D]], %[[Z]])
// CHECK-NOT: fsdp.pointwise

// -----

// A call reading a view of a gathered buffer (Mamba's `dt + bias[:, None]`)
// cannot move below the buffer's reshard either (before 2026-11-28 only a
// reshard of the operand itself held it, and the kernel read freed memory).
module attributes {fsdp.device = "cuda"} {
fsdp.unit @root root
fsdp.param @b : tensor<8xf32> unit @root sharded on @g axes = [0] padding = 0
shard.grid @g(shape = 1)
// CHECK-LABEL: func.func @view_of_a_resharded_buffer
func.func @view_of_a_resharded_buffer(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %x0 = fsdp.aten "aten::mm"(%x, %x) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %s = fsdp.get_param @b : tensor<8xf32>
  %f = fsdp.all_gather_start %s on @g axes = [0] : tensor<8xf32> -> !fsdp.future<tensor<8xf32>>
  %b = fsdp.wait %f : !fsdp.future<tensor<8xf32>>
  %u = fsdp.aten "aten::unsqueeze"(%b) args [0 : index, 1] : (tensor<8xf32>) -> tensor<8x1xf32>
  %c = fsdp.aten "aten::add.Tensor"(%x0, %u) args [0 : index, 1 : index, 1] : (tensor<8x8xf32>, tensor<8x1xf32>) -> tensor<8x8xf32>
  fsdp.reshard %b : tensor<8xf32>
  %z = fsdp.aten "aten::mm"(%x, %x) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %k = fsdp.aten "aten::mul.Tensor"(%c, %z) : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  return %k : tensor<8x8xf32>
}
}
// CHECK-NOT: fsdp.pointwise
// CHECK:     fsdp.aten "aten::add.Tensor"
// CHECK-NEXT: fsdp.reshard
// CHECK-NOT: fsdp.pointwise

// -----

// No move may raise the step's peak: a kernel holds the operands of all its
// calls until it runs. In SwiGLU's backward, the product of the gradient
// and the up projection sunk to its silu_backward would keep both operands
// (8 KiB each) alive across the weight gradient's mm, the peak, where the
// product alone (8 KiB) was: it stays a call. Where silu_backward's other
// operand exists at the product, silu_backward moves up to it instead,
// which lowers the peak (its result replaces the product and that operand).
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @peak_between
func.func @peak_between(%x: tensor<64x64xbf16>, %w: tensor<64x64xbf16>, %y: tensor<256x64xbf16>) -> (tensor<64x64xbf16>, tensor<256x1xbf16>) {
  %g = fsdp.aten "aten::mm"(%x, %w) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %u = fsdp.aten "aten::mm"(%w, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %p = fsdp.aten "aten::mul.Tensor"(%g, %u) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %dw = fsdp.aten "aten::mm"(%y, %x) : (tensor<256x64xbf16>, tensor<64x64xbf16>) -> tensor<256x64xbf16>
  %s = fsdp.aten "aten::sum.dim_IntList"(%dw) args [0 : index, [1], true, unit] : (tensor<256x64xbf16>) -> tensor<256x1xbf16>
  %h = fsdp.aten "aten::mm"(%x, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %r = fsdp.aten "aten::silu_backward"(%p, %h) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  return %r, %s : tensor<64x64xbf16>, tensor<256x1xbf16>
}
// CHECK-NOT: fsdp.pointwise
// CHECK:     fsdp.aten "aten::mul.Tensor"
// CHECK:     fsdp.aten "aten::silu_backward"

// CHECK-LABEL: func.func @moved_up
func.func @moved_up(%x: tensor<64x64xbf16>, %w: tensor<64x64xbf16>, %y: tensor<256x64xbf16>) -> (tensor<64x64xbf16>, tensor<256x1xbf16>) {
  %g = fsdp.aten "aten::mm"(%x, %w) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %u = fsdp.aten "aten::mm"(%w, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %h = fsdp.aten "aten::mm"(%x, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %p = fsdp.aten "aten::mul.Tensor"(%g, %u) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %dw = fsdp.aten "aten::mm"(%y, %x) : (tensor<256x64xbf16>, tensor<64x64xbf16>) -> tensor<256x64xbf16>
  %s = fsdp.aten "aten::sum.dim_IntList"(%dw) args [0 : index, [1], true, unit] : (tensor<256x64xbf16>) -> tensor<256x1xbf16>
  %r = fsdp.aten "aten::silu_backward"(%p, %h) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  return %r, %s : tensor<64x64xbf16>, tensor<256x1xbf16>
}
// CHECK:      fsdp.pointwise
// CHECK-NEXT: ^bb0
// CHECK-NEXT:   fsdp.aten "aten::mul.Tensor"
// CHECK-NEXT:   fsdp.aten "aten::silu_backward"
// CHECK:      fsdp.aten "aten::mm"(%arg2, %arg0)
}

// -----

// A value read before the chain ends keeps its producer out of the chain's
// kernel; a CPU step is left alone.
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @read_between
func.func @read_between(%x: tensor<4xf32>) -> tensor<4xf32> {
  %d = fsdp.aten "aten::mm"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %a = fsdp.aten "aten::exp"(%d) : (tensor<4xf32>) -> tensor<4xf32>
  %b = fsdp.aten "aten::mm"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %c = fsdp.aten "aten::add.Tensor"(%a, %b) args [0 : index, 1 : index, 1] : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %e = fsdp.aten "aten::tanh"(%c) : (tensor<4xf32>) -> tensor<4xf32>
  return %e : tensor<4xf32>
}
}
// CHECK:      fsdp.aten "aten::exp"
// CHECK-NEXT: fsdp.aten "aten::mm"
// CHECK-NEXT: fsdp.pointwise
// CHECK-NEXT: ^bb0
// CHECK-NEXT:   fsdp.aten "aten::add.Tensor"
// CHECK-NEXT:   fsdp.aten "aten::tanh"

// -----

module attributes {fsdp.device = "cpu"} {
// CHECK-LABEL: func.func @cpu_step
func.func @cpu_step(%x: tensor<4xf32>) -> tensor<4xf32> {
  %d = fsdp.aten "aten::mm"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %a = fsdp.aten "aten::exp"(%d) : (tensor<4xf32>) -> tensor<4xf32>
  %b = fsdp.aten "aten::neg"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %b : tensor<4xf32>
}
}
// CHECK-NOT: fsdp.pointwise

// -----

// RMSNorm's backward shape: a call reading two groups merges them, and a
// broadcast (expand) read only inside is the kernel's own broadcasting.
// An expand that is read outside stays a view: its group stays calls.
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @merge_and_broadcast
func.func @merge_and_broadcast(%g: tensor<4x8xf32>, %r: tensor<4x1xf32>, %x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %gd = fsdp.aten "aten::clone"(%g) args [0 : index, "contiguous_format"] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %rd = fsdp.aten "aten::clone"(%r) args [0 : index, "contiguous_format"] : (tensor<4x1xf32>) -> tensor<4x1xf32>
  %xd = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %p = fsdp.aten "aten::pow.Tensor_Scalar"(%rd) args [0 : index, 3] : (tensor<4x1xf32>) -> tensor<4x1xf32>
  %s = fsdp.aten "aten::mul.Scalar"(%rd) args [0 : index, -5.000000e-01] : (tensor<4x1xf32>) -> tensor<4x1xf32>
  %m = fsdp.aten "aten::mul.Tensor"(%s, %p) : (tensor<4x1xf32>, tensor<4x1xf32>) -> tensor<4x1xf32>
  %e = fsdp.aten "aten::expand"(%m) args [0 : index, [4, 8], false] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %dv = fsdp.aten "aten::div.Scalar"(%e) args [0 : index, 8] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %x2 = fsdp.aten "aten::mul.Scalar"(%xd) args [0 : index, 2.000000e+00] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = fsdp.aten "aten::mul.Tensor"(%dv, %x2) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %z = fsdp.aten "aten::add.Tensor"(%gd, %y) args [0 : index, 1 : index, 1] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %z : tensor<4x8xf32>
}
// CHECK:      %[[G:.*]] = fsdp.aten "aten::clone"
// CHECK:      %[[R:.*]] = fsdp.aten "aten::clone"
// CHECK:      %[[X:.*]] = fsdp.aten "aten::clone"
// CHECK-NEXT: %[[Z:.*]] = fsdp.pointwise(%[[R]], %[[X]], %[[G]]) : (tensor<4x1xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK:        fsdp.aten "aten::pow.Tensor_Scalar"
// CHECK:        fsdp.aten "aten::mul.Scalar"
// CHECK:        fsdp.aten "aten::mul.Tensor"
// CHECK:        fsdp.aten "aten::expand"
// CHECK:        fsdp.aten "aten::div.Scalar"
// CHECK:        fsdp.aten "aten::mul.Scalar"
// CHECK:        fsdp.aten "aten::mul.Tensor"
// CHECK:        fsdp.aten "aten::add.Tensor"
// CHECK:      return %[[Z]]

// CHECK-LABEL: func.func @broadcast_read_outside
func.func @broadcast_read_outside(%r: tensor<4x1xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %rd = fsdp.aten "aten::clone"(%r) args [0 : index, "contiguous_format"] : (tensor<4x1xf32>) -> tensor<4x1xf32>
  %n = fsdp.aten "aten::neg"(%rd) : (tensor<4x1xf32>) -> tensor<4x1xf32>
  %e = fsdp.aten "aten::expand"(%n) args [0 : index, [4, 8], false] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %d = fsdp.aten "aten::exp"(%e) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %e, %d : tensor<4x8xf32>, tensor<4x8xf32>
}
// CHECK-NOT: fsdp.pointwise
// CHECK:     fsdp.aten "aten::expand"
// CHECK:     fsdp.aten "aten::exp"

// Adaptive average pooling's gradient: an expand of the kernel's only input
// makes it grow past what it reads, so it stays calls (before 2026-11-28 it
// became a kernel the verifier refused).
// CHECK-LABEL: func.func @grows_past_its_inputs
func.func @grows_past_its_inputs(%g: tensor<4x1xf32>) -> tensor<4x8xf32> {
  %e = fsdp.aten "aten::expand"(%g) args [0 : index, [4, 8], false] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %d = fsdp.aten "aten::div.Scalar"(%e) args [0 : index, 8] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %d : tensor<4x8xf32>
}
// CHECK-NOT: fsdp.pointwise
// CHECK:     fsdp.aten "aten::expand"
// CHECK:     fsdp.aten "aten::div.Scalar"
}

// -----

// Rotary positions on a query viewed as heads: `q * cos + cat(-q[..., 4:],
// q[..., :4]) * sin`. The slices and the concatenation address halves of
// the last dimension, so the kernel runs over it as [2, 4]: it reads the
// query split so (a view), each half of it (slices of that view, read
// across both halves), the tables split alike, and which half an element is
// in (one [2, 1] bool tensor per function: an identity matrix's second
// column); the concatenation is a choice by the half. Its result, viewed
// back, is laid out by its first input, the query, as eager's add is by
// its first operand, the query's product.
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @rotary
func.func @rotary(%x: tensor<16x8xf32>, %cos: tensor<4x8xf32>, %sin: tensor<4x8xf32>) -> tensor<2x2x4x8xf32> {
  %xd = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<16x8xf32>) -> tensor<16x8xf32>
  %cd = fsdp.aten "aten::clone"(%cos) args [0 : index, "contiguous_format"] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %sd = fsdp.aten "aten::clone"(%sin) args [0 : index, "contiguous_format"] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %v = fsdp.aten "aten::view"(%xd) args [0 : index, [2, 4, 2, 8]] : (tensor<16x8xf32>) -> tensor<2x4x2x8xf32>
  %q = fsdp.aten "aten::permute"(%v) args [0 : index, [0, 2, 1, 3]] : (tensor<2x4x2x8xf32>) -> tensor<2x2x4x8xf32>
  %lo = fsdp.aten "aten::slice.Tensor"(%q) args [0 : index, 3, 0, 4, 1] : (tensor<2x2x4x8xf32>) -> tensor<2x2x4x4xf32>
  %hi = fsdp.aten "aten::slice.Tensor"(%q) args [0 : index, 3, 4, 9223372036854775807, 1] : (tensor<2x2x4x8xf32>) -> tensor<2x2x4x4xf32>
  %qc = fsdp.aten "aten::mul.Tensor"(%q, %cd) : (tensor<2x2x4x8xf32>, tensor<4x8xf32>) -> tensor<2x2x4x8xf32>
  %n = fsdp.aten "aten::neg"(%hi) : (tensor<2x2x4x4xf32>) -> tensor<2x2x4x4xf32>
  %r = fsdp.aten "aten::cat"(%n, %lo) args [[0 : index, 1 : index], -1] : (tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>) -> tensor<2x2x4x8xf32>
  %rs = fsdp.aten "aten::mul.Tensor"(%r, %sd) : (tensor<2x2x4x8xf32>, tensor<4x8xf32>) -> tensor<2x2x4x8xf32>
  %out = fsdp.aten "aten::add.Tensor"(%qc, %rs) args [0 : index, 1 : index, 1] : (tensor<2x2x4x8xf32>, tensor<2x2x4x8xf32>) -> tensor<2x2x4x8xf32>
  return %out : tensor<2x2x4x8xf32>
}
}
// The half index is 0 or 1 in the kernel's element type: no bool input.
// CHECK:      %[[EYE:.*]] = fsdp.aten "aten::eye"() args [2, f32, "strided", "<device>", false] : () -> tensor<2x2xf32>
// CHECK-NEXT: %[[HALF:.*]] = fsdp.aten "aten::slice.Tensor"(%[[EYE]]) args [0 : index, 1, 1, 2, 1] : (tensor<2x2xf32>) -> tensor<2x1xf32>
// CHECK:      %[[COS:.*]] = fsdp.aten "aten::view"(%{{.*}}) args [0 : index, [4, 2, 4]]
// CHECK:      %[[SIN:.*]] = fsdp.aten "aten::view"(%{{.*}}) args [0 : index, [4, 2, 4]]
// CHECK:      %[[Q:.*]] = fsdp.aten "aten::permute"
// CHECK-NEXT: %[[Q2:.*]] = fsdp.aten "aten::view"(%[[Q]]) args [0 : index, [2, 2, 4, 2, 4]]
// CHECK-NEXT: %[[Q2LO:.*]] = fsdp.aten "aten::slice.Tensor"(%[[Q2]]) args [0 : index, 3, 0, 1, 1] : (tensor<2x2x4x2x4xf32>) -> tensor<2x2x4x1x4xf32>
// CHECK-NEXT: %[[Q2HI:.*]] = fsdp.aten "aten::slice.Tensor"(%[[Q2]]) args [0 : index, 3, 1, 2, 1] : (tensor<2x2x4x2x4xf32>) -> tensor<2x2x4x1x4xf32>
// CHECK-NEXT: %[[K:.*]] = fsdp.pointwise(%[[Q2]], %[[COS]], %[[Q2HI]], %[[Q2LO]], %[[SIN]], %[[HALF]]) : (tensor<2x2x4x2x4xf32>, tensor<4x2x4xf32>, tensor<2x2x4x1x4xf32>, tensor<2x2x4x1x4xf32>, tensor<4x2x4xf32>, tensor<2x1xf32>) -> tensor<2x2x4x2x4xf32> {
// CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<2x2x4x2x4xf32>, %[[B:.*]]: tensor<4x2x4xf32>, %[[C:.*]]: tensor<2x2x4x1x4xf32>, %[[D:.*]]: tensor<2x2x4x1x4xf32>, %[[E:.*]]: tensor<4x2x4xf32>, %[[F:.*]]: tensor<2x1xf32>):
// CHECK-NEXT:   %[[QC:.*]] = fsdp.aten "aten::mul.Tensor"(%[[A]], %[[B]])
// CHECK-NEXT:   %[[N:.*]] = fsdp.aten "aten::neg"(%[[C]]) : (tensor<2x2x4x1x4xf32>) -> tensor<2x2x4x1x4xf32>
// CHECK-NEXT:   %[[SECOND:.*]] = fsdp.aten "aten::ne.Scalar"(%[[F]]) args [0 : index, 0] : (tensor<2x1xf32>) -> tensor<2x1xi1>
// CHECK-NEXT:   %[[R:.*]] = fsdp.aten "aten::where.self"(%[[SECOND]], %[[D]], %[[N]]) : (tensor<2x1xi1>, tensor<2x2x4x1x4xf32>, tensor<2x2x4x1x4xf32>) -> tensor<2x2x4x2x4xf32>
// CHECK-NEXT:   %[[RS:.*]] = fsdp.aten "aten::mul.Tensor"(%[[R]], %[[E]])
// CHECK-NEXT:   %[[O:.*]] = fsdp.aten "aten::add.Tensor"(%[[QC]], %[[RS]])
// CHECK-NEXT:   fsdp.yield %[[O]] : tensor<2x2x4x2x4xf32>
// CHECK:      %[[OUT:.*]] = fsdp.aten "aten::view"(%[[K]]) args [0 : index, [2, 2, 4, 8]] : (tensor<2x2x4x2x4xf32>) -> tensor<2x2x4x8xf32>
// CHECK-NEXT: return %[[OUT]]

// -----

// Its backward: `g * cos + cat(y[..., 4:], -y[..., :4])` with y = g * sin.
// The slices read a product inside the kernel, so the kernel computes each
// half of it from halves of its operands. A concatenation handed out on
// its own would be laid out unlike eager (row-major, where the kernel
// follows the query), so only the add makes the group a kernel.
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @rotary_backward
func.func @rotary_backward(%x: tensor<16x8xf32>, %cos: tensor<4x8xf32>, %sin: tensor<4x8xf32>) -> tensor<2x2x4x8xf32> {
  %xd = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<16x8xf32>) -> tensor<16x8xf32>
  %cd = fsdp.aten "aten::clone"(%cos) args [0 : index, "contiguous_format"] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %sd = fsdp.aten "aten::clone"(%sin) args [0 : index, "contiguous_format"] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %v = fsdp.aten "aten::view"(%xd) args [0 : index, [2, 4, 2, 8]] : (tensor<16x8xf32>) -> tensor<2x4x2x8xf32>
  %g = fsdp.aten "aten::permute"(%v) args [0 : index, [0, 2, 1, 3]] : (tensor<2x4x2x8xf32>) -> tensor<2x2x4x8xf32>
  %y = fsdp.aten "aten::mul.Tensor"(%g, %sd) : (tensor<2x2x4x8xf32>, tensor<4x8xf32>) -> tensor<2x2x4x8xf32>
  %lo = fsdp.aten "aten::slice.Tensor"(%y) args [0 : index, 3, 0, 4, 1] : (tensor<2x2x4x8xf32>) -> tensor<2x2x4x4xf32>
  %hi = fsdp.aten "aten::slice.Tensor"(%y) args [0 : index, 3, 4, 8, 1] : (tensor<2x2x4x8xf32>) -> tensor<2x2x4x4xf32>
  %n = fsdp.aten "aten::neg"(%lo) : (tensor<2x2x4x4xf32>) -> tensor<2x2x4x4xf32>
  %gc = fsdp.aten "aten::mul.Tensor"(%g, %cd) : (tensor<2x2x4x8xf32>, tensor<4x8xf32>) -> tensor<2x2x4x8xf32>
  %r = fsdp.aten "aten::cat"(%hi, %n) args [[0 : index, 1 : index], 3] : (tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>) -> tensor<2x2x4x8xf32>
  %out = fsdp.aten "aten::add.Tensor"(%gc, %r) args [0 : index, 1 : index, 1] : (tensor<2x2x4x8xf32>, tensor<2x2x4x8xf32>) -> tensor<2x2x4x8xf32>
  return %out : tensor<2x2x4x8xf32>
}
}
// CHECK:      %[[K:.*]] = fsdp.pointwise(%[[G2:.*]], %[[COS:.*]], %[[G2HI:.*]], %[[SINHI:.*]], %[[G2LO:.*]], %[[SINLO:.*]], %[[HALF:.*]]) : (tensor<2x2x4x2x4xf32>, tensor<4x2x4xf32>, tensor<2x2x4x1x4xf32>, tensor<4x1x4xf32>, tensor<2x2x4x1x4xf32>, tensor<4x1x4xf32>, tensor<2x1xf32>) -> tensor<2x2x4x2x4xf32> {
// CHECK-NEXT: ^bb0(%[[A:.*]]: {{.*}}, %[[B:.*]]: {{.*}}, %[[C:.*]]: {{.*}}, %[[D:.*]]: {{.*}}, %[[E:.*]]: {{.*}}, %[[F:.*]]: {{.*}}, %[[H:.*]]: tensor<2x1xf32>):
// CHECK-NEXT:   %[[GC:.*]] = fsdp.aten "aten::mul.Tensor"(%[[A]], %[[B]])
// CHECK-NEXT:   %[[YHI:.*]] = fsdp.aten "aten::mul.Tensor"(%[[C]], %[[D]]) : (tensor<2x2x4x1x4xf32>, tensor<4x1x4xf32>) -> tensor<2x2x4x1x4xf32>
// CHECK-NEXT:   %[[YLO:.*]] = fsdp.aten "aten::mul.Tensor"(%[[E]], %[[F]]) : (tensor<2x2x4x1x4xf32>, tensor<4x1x4xf32>) -> tensor<2x2x4x1x4xf32>
// CHECK-NEXT:   %[[N:.*]] = fsdp.aten "aten::neg"(%[[YLO]])
// CHECK-NEXT:   %[[SECOND:.*]] = fsdp.aten "aten::ne.Scalar"(%[[H]])
// CHECK-NEXT:   %[[R:.*]] = fsdp.aten "aten::where.self"(%[[SECOND]], %[[N]], %[[YHI]])
// CHECK-NEXT:   %[[O:.*]] = fsdp.aten "aten::add.Tensor"(%[[GC]], %[[R]])
// CHECK:      fsdp.aten "aten::view"(%[[K]]) args [0 : index, [2, 2, 4, 8]]
// CHECK-NOT:  fsdp.aten "aten::cat"

// -----

// Not fused: a choice by a bool mask made outside. A kernel reading a bool
// input would go through the jiterator's dynamic casting, slower than the
// two calls (benchmarks/pointwise_paths.py); the mask's own comparison is
// a call too, its result a bool.
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @bool_mask_from_outside
func.func @bool_mask_from_outside(%x: tensor<8x8xbf16>, %m: tensor<8x8xi1>) -> tensor<8x8xbf16> {
  %xd = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<8x8xbf16>) -> tensor<8x8xbf16>
  %n = fsdp.aten "aten::neg"(%xd) : (tensor<8x8xbf16>) -> tensor<8x8xbf16>
  %w = fsdp.aten "aten::where.self"(%m, %n, %xd) : (tensor<8x8xi1>, tensor<8x8xbf16>, tensor<8x8xbf16>) -> tensor<8x8xbf16>
  %c = fsdp.aten "aten::ne.Scalar"(%w) args [0 : index, 0] : (tensor<8x8xbf16>) -> tensor<8x8xi1>
  %y = fsdp.aten "aten::where.self"(%c, %w, %xd) : (tensor<8x8xi1>, tensor<8x8xbf16>, tensor<8x8xbf16>) -> tensor<8x8xbf16>
  return %y : tensor<8x8xbf16>
}
}
// CHECK-NOT:  fsdp.pointwise
// CHECK:      fsdp.aten "aten::neg"
// CHECK:      fsdp.aten "aten::where.self"
// CHECK:      fsdp.aten "aten::ne.Scalar"
// CHECK:      fsdp.aten "aten::where.self"
// CHECK-NOT:  fsdp.pointwise

// -----

// Siblings: SwiGLU's two input gradients both read the gradient of its
// product (%g). The up projection's gradient (%gu) is read by a weight
// gradient's mm before the gate's gradient is computed; the gate's
// gradient (mul, silu_backward) moves up to it, and one kernel reads %g
// once and hands out both gradients. Where the gate's other operand is
// made after the up projection's gradient, nothing moves.
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @siblings
func.func @siblings(%x: tensor<64x64xbf16>, %s: tensor<64x64xbf16>, %up: tensor<64x64xbf16>, %gate: tensor<64x64xbf16>) -> (tensor<64x64xbf16>, tensor<64x64xbf16>) {
  %g = fsdp.aten "aten::mm"(%x, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %gu = fsdp.aten "aten::mul.Tensor"(%g, %s) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %dw = fsdp.aten "aten::mm"(%gu, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %a = fsdp.aten "aten::mul.Tensor"(%g, %up) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %gg = fsdp.aten "aten::silu_backward"(%a, %gate) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  return %dw, %gg : tensor<64x64xbf16>, tensor<64x64xbf16>
}
// CHECK:      %[[G:.*]] = fsdp.aten "aten::mm"(%arg0, %arg0)
// CHECK-NEXT: %[[K:.*]]:2 = fsdp.pointwise(%[[G]], %arg1, %arg2, %arg3)
// CHECK-NEXT: ^bb0
// CHECK-NEXT:   fsdp.aten "aten::mul.Tensor"
// CHECK-NEXT:   fsdp.aten "aten::mul.Tensor"
// CHECK-NEXT:   fsdp.aten "aten::silu_backward"
// CHECK-NEXT:   fsdp.yield
// CHECK-NEXT: }
// CHECK-NEXT: fsdp.aten "aten::mm"(%[[K]]#0, %arg0)
// CHECK-NEXT: return

// CHECK-LABEL: func.func @sibling_operand_made_later
func.func @sibling_operand_made_later(%x: tensor<64x64xbf16>, %s: tensor<64x64xbf16>, %up: tensor<64x64xbf16>) -> (tensor<64x64xbf16>, tensor<64x64xbf16>) {
  %g = fsdp.aten "aten::mm"(%x, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %gu = fsdp.aten "aten::mul.Tensor"(%g, %s) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %dw = fsdp.aten "aten::mm"(%gu, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %a = fsdp.aten "aten::mul.Tensor"(%g, %dw) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %gg = fsdp.aten "aten::silu_backward"(%a, %up) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  return %dw, %gg : tensor<64x64xbf16>, tensor<64x64xbf16>
}
// CHECK:      fsdp.aten "aten::mul.Tensor"(%{{.*}}, %arg1)
// CHECK-NEXT: fsdp.aten "aten::mm"
// CHECK-NEXT: fsdp.pointwise
// CHECK-NEXT: ^bb0
// CHECK-NEXT:   fsdp.aten "aten::mul.Tensor"
// CHECK-NEXT:   fsdp.aten "aten::silu_backward"
}

// -----

// A kernel that reads another kernel's result computed only from tensors
// it reads too computes it inside: SwiGLU's gradient kernel reads gate, so
// it recomputes silu(gate) instead of reading the forward kernel's copy,
// which then writes only the product the weight gradient reads. (The
// step's peak is the wide product's: the moves stay below it.)
module attributes {fsdp.device = "cuda"} {
// CHECK-LABEL: func.func @recomputed_inside
func.func @recomputed_inside(%x: tensor<64x64xbf16>, %gate: tensor<64x64xbf16>, %up: tensor<64x64xbf16>, %y: tensor<1024x64xbf16>) -> (tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<1024x1xbf16>) {
  %wide = fsdp.aten "aten::mm"(%y, %x) : (tensor<1024x64xbf16>, tensor<64x64xbf16>) -> tensor<1024x64xbf16>
  %peak = fsdp.aten "aten::sum.dim_IntList"(%wide) args [0 : index, [1], true, unit] : (tensor<1024x64xbf16>) -> tensor<1024x1xbf16>
  %gd = fsdp.aten "aten::clone"(%gate) args [0 : index, "contiguous_format"] : (tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %ud = fsdp.aten "aten::clone"(%up) args [0 : index, "contiguous_format"] : (tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %s = fsdp.aten "aten::silu"(%gd) : (tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %h = fsdp.aten "aten::mul.Tensor"(%s, %ud) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %dh = fsdp.aten "aten::mm"(%h, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %g = fsdp.aten "aten::mm"(%dh, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %gu = fsdp.aten "aten::mul.Tensor"(%g, %s) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %dw = fsdp.aten "aten::mm"(%gu, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %a = fsdp.aten "aten::mul.Tensor"(%g, %ud) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %gg = fsdp.aten "aten::silu_backward"(%a, %gd) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  return %dw, %gg, %peak : tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<1024x1xbf16>
}
// CHECK:      %[[GATE:.*]] = fsdp.aten "aten::clone"(%arg1)
// CHECK-NEXT: %[[UP:.*]] = fsdp.aten "aten::clone"(%arg2)
// CHECK-NEXT: %[[H:.*]] = fsdp.pointwise(%[[GATE]], %[[UP]]) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16> {
// CHECK-NEXT: ^bb0
// CHECK-NEXT:   fsdp.aten "aten::silu"
// CHECK-NEXT:   fsdp.aten "aten::mul.Tensor"
// CHECK-NEXT:   fsdp.yield
// CHECK-NEXT: }
// CHECK-NEXT: %[[DH:.*]] = fsdp.aten "aten::mm"(%[[H]], %arg0)
// CHECK-NEXT: %[[G:.*]] = fsdp.aten "aten::mm"(%[[DH]], %arg0)
// CHECK-NEXT: %[[K:.*]]:2 = fsdp.pointwise(%[[G]], %[[UP]], %[[GATE]])
// CHECK-NEXT: ^bb0(%[[GA:.*]]: tensor<64x64xbf16>, %[[UA:.*]]: tensor<64x64xbf16>, %[[GTA:.*]]: tensor<64x64xbf16>):
// CHECK-NEXT:   %[[S:.*]] = fsdp.aten "aten::silu"(%[[GTA]])
// CHECK-NEXT:   fsdp.aten "aten::mul.Tensor"(%[[GA]], %[[S]])
// CHECK-NEXT:   fsdp.aten "aten::mul.Tensor"(%[[GA]], %[[UA]])
// CHECK-NEXT:   fsdp.aten "aten::silu_backward"
// CHECK-NEXT:   fsdp.yield
// CHECK-NEXT: }
// CHECK-NEXT: fsdp.aten "aten::mm"(%[[K]]#0, %arg0)
}
