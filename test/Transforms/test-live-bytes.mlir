// RUN: fsdp-opt %s -split-input-file --fsdp-test-live-bytes | FileCheck %s --check-prefix=RELEASES
// RUN: fsdp-opt %s -split-input-file --fsdp-test-live-bytes="frees=last-use" | FileCheck %s --check-prefix=LAST-USE
// RUN: not fsdp-opt %s -split-input-file --fsdp-test-live-bytes="frees=never" 2>&1 | FileCheck %s --check-prefix=BAD

// A clone, its product (64 bytes each), a view of the product and its sum
// (4 bytes, the loss): with the releases the step holds, and by last use,
// the same bytes after each op (the clone dies at the product, the product
// with its view at the sum). On the same step without releases the last-use
// rule still frees them there; the runtime's rule keeps them to the end.
// RELEASES:  func.func @released(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 128, 64, 68, 4, 4>, test.live_peak = 128 : i64}
// LAST-USE:  func.func @released(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 128, 64, 68, 4, 4>, test.live_peak = 128 : i64}
// BAD: frees must be releases or last-use, got 'never'
func.func @released(%x: tensor<4x4xf32>) -> tensor<f32> {
  %a = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %b = fsdp.aten "aten::mul.Tensor"(%a, %a) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  fsdp.release %a : tensor<4x4xf32>
  %v = fsdp.aten "aten::view"(%b) args [0 : index, [16]] : (tensor<4x4xf32>) -> tensor<16xf32>
  %l = fsdp.aten "aten::sum"(%v) : (tensor<16xf32>) -> tensor<f32>
  fsdp.release %b, %v : tensor<4x4xf32>, tensor<16xf32>
  fsdp.loss %l : tensor<f32>
  return %l : tensor<f32>
}

// -----

// RELEASES:  func.func @unreleased(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 128, 128, 132, 132, 132>, test.live_peak = 132 : i64}
// LAST-USE:  func.func @unreleased(%arg0: tensor<4x4xf32>) -> tensor<f32> attributes {test.live_after = array<i64: 64, 128, 64, 68, 4, 4>, test.live_peak = 128 : i64}
func.func @unreleased(%x: tensor<4x4xf32>) -> tensor<f32> {
  %a = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %b = fsdp.aten "aten::mul.Tensor"(%a, %a) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %v = fsdp.aten "aten::view"(%b) args [0 : index, [16]] : (tensor<4x4xf32>) -> tensor<16xf32>
  %l = fsdp.aten "aten::sum"(%v) : (tensor<16xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  return %l : tensor<f32>
}
