// DEFINE: %{machine} = gpu=custom memory-gib=1 tensor-tflops=1 fp32-tflops=1 memory-gbps=100 intra-node-gbps=1 inter-node-gbps=0.5 host-link-gbps=1 matmul-efficiency=1 attention-efficiency=1 memory-efficiency=1 collective-latency-us=0 issue-us=0 shortest-kernel-us=0
// RUN: fsdp-opt %s --fsdp-step-time="%{machine} trace=%t.json" -o /dev/null | FileCheck %s
// RUN: FileCheck %s --check-prefix=TRACE < %t.json
// RUN: fsdp-opt %s --fsdp-step-time="%{machine} gpus-per-node=1" -o /dev/null | FileCheck %s --check-prefix=NODES
// RUN: fsdp-opt %s --fsdp-gather-into-results --fsdp-step-time="%{machine}" -o /dev/null | FileCheck %s --check-prefix=INTO
// RUN: fsdp-opt %s --fsdp-step-time="%{machine} format=json" -o /dev/null | FileCheck %s --check-prefix=JSON
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 offload=l0" --fsdp-step-time="%{machine} overlap-host-optimizer=true host-optimizer-gbps=0.001 trace=%t.overlap.json" -o /dev/null | FileCheck %s --check-prefix=OVERLAP
// RUN: FileCheck %s --check-prefix=OVERLAP-TRACE < %t.overlap.json
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 offload=*" --fsdp-step-time="%{machine} overlap-host-optimizer=true host-optimizer-gbps=0.001 issue-us=25" -o /dev/null | FileCheck %s --check-prefix=BESIDE
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 offload=*" --fsdp-step-time="%{machine} host-optimizer-in-backward=true host-optimizer-gbps=0.001 issue-us=25 trace=%t.landed.json" -o /dev/null | FileCheck %s --check-prefix=LANDED
// RUN: FileCheck %s --check-prefix=LANDED-TRACE < %t.landed.json
// RUN: fsdp-opt %S/Inputs/pointwise-step.mlir --fsdp-sharding-pipeline="ranks=2" --fsdp-step-time="%{machine} trace=%t.kernels.json" -o /dev/null
// RUN: FileCheck %s --check-prefix=KERNELS < %t.kernels.json
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=2 backend=nccl" --fsdp-step-time="%{machine} issue-us=25" -o /dev/null | FileCheck %s --check-prefix=ISSUED
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=2 backend=nccl cuda-graph=true" --fsdp-step-time="%{machine} issue-us=25" -o /dev/null | FileCheck %s --check-prefix=REPLAYED
// RUN: not fsdp-opt %s --fsdp-step-time="gpu=b200" -o /dev/null 2>&1 | FileCheck %s --check-prefix=KIND
// RUN: not fsdp-opt %s --fsdp-step-time="gpu=custom memory-gib=80" -o /dev/null 2>&1 | FileCheck %s --check-prefix=CUSTOM
// RUN: not fsdp-opt %s --fsdp-step-time="memory-gbps=-5" -o /dev/null 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// RUN: not fsdp-opt %s --fsdp-step-time="matmul-efficiency=1.5" -o /dev/null 2>&1 | FileCheck %s --check-prefix=EFFICIENCY
// RUN: not fsdp-opt %s --fsdp-step-time="optimizer=lion" -o /dev/null 2>&1 | FileCheck %s --check-prefix=OPTIMIZER
// RUN: fsdp-opt %S/Inputs/conv-step.mlir --fsdp-sharding-pipeline="ranks=2" --fsdp-step-time="%{machine} format=json" -o /dev/null | FileCheck %s --check-prefix=CONV

// A 2-rank step, by hand, on a GPU of 1 TFLOP/s, 100 GB/s of memory
// bandwidth, 1 GB/s inside a node and 0.5 GB/s across (ring steps: 1 us
// inside a node, 5 us across), every efficiency 1 and no fixed costs:
//   all-gather copy-in: 1e6 B read + 1e6 B written          0.020 ms
//   all-gather: 1 ring step + 1/2 x 2e6 B at 1 GB/s          1.001 ms, exposed
//   all-gather copy-out: 2e6 B read + 2e6 B written          0.040 ms
//   mm: 2 x 1000^3 FLOP                                      2.000 ms
//   causal flash attention: 4 x 2 x 1000 x 1000 x 64 / 2    0.256 ms
//   sum: 2e6 B + 4 B read and written                        0.020 ms
//   mm                                                       2.000 ms
//   reduce-scatter copy-in: 2e6 B read + 2e6 B written       0.040 ms
//   reduce-scatter, like the all-gather                      1.001 ms, exposed
//   AdamW on the 1e6 B shard: 2 x 1e6 + 1e6 + 2 x 2e6 B      0.070 ms
// step 6.448 ms; 4.256 GFLOP in it is 66.0% of the peak. With one GPU per
// node each collective crosses the network: 5 us + 2 ms, 2.005 ms each.
// CHECK:      predicted step per rank: @train_step on custom GPU (8 GPUs per node)
// CHECK-NEXT:   step                             6.45 ms{{$}}
// CHECK-NEXT:   compute kernels                  4.38 ms   4.256 GFLOP (4.256 GFLOP without recomputation)
// CHECK-NEXT:   collectives                      2.00 ms   on their own streams
// CHECK-NEXT:   exposed communication            2.00 ms   compute waiting for collectives
// CHECK-NEXT:   host-bound                       0.00 ms   compute waiting for the host to issue (7 instructions)
// CHECK-NEXT:   optimizer step                   0.07 ms   0.00 ms of it on the host
// CHECK-NEXT:   model FLOPs utilization          66.0 %

// NODES:      step                             8.46 ms

// Gathered into the parameters: no copy-out.
// INTO:       step                             6.41 ms
// INTO-NEXT:  compute kernels                  4.34 ms
// NODES:      collectives                      4.01 ms

// JSON: "first_input_shape": [
// JSON-NEXT: 1000,
// JSON-NEXT: 1000
// JSON: "flops": 4256000000,
// JSON: "ideal_s": {
// JSON-NEXT: "attention": 0.000{{25599|256}}
// JSON-NEXT: "matmul": 0.00{{39999|4}}
// JSON-NEXT: "memory": {{0.000120000|0.000119999}}
// Each operator's kernel class, by the name profilers print (fsdpc plan --profile reads them).
// JSON: "kernel_classes": {
// JSON-NEXT: "aten::_scaled_dot_product_flash_attention": "attention",
// JSON-NEXT: "aten::mm": "matmul",
// JSON-NEXT: "aten::sum": "memory",
// JSON-NEXT: "aten::view": "view"
// JSON: "kind": "custom",
// JSON: "model_flops": 4256000000,

// One track per stream; each collective on its group's.
// TRACE: "name": "compute"
// TRACE: "name": "collectives @fsdp_grid axes [0]"
// TRACE: "dur": 20,
// TRACE-NEXT: "name": "copy-in fsdp.all_gather_start @l0",
// TRACE: "dur": 1001,
// TRACE-NEXT: "name": "fsdp.all_gather_start @l0",
// TRACE-NEXT: "ph": "X",
// TRACE-NEXT: "pid": 1,
// TRACE-NEXT: "tid": 2,
// TRACE: "name": "wait fsdp.all_gather_start @l0",
// TRACE: "dur": 40,
// TRACE-NEXT: "name": "copy-out fsdp.all_gather_start @l0",
// TRACE: "dur": 256,
// TRACE-NEXT: "name": "aten::_scaled_dot_product_flash_attention",

// Overlapped, the host steps offloaded l0 (2 x 100 B shard + 100 B gradient
// + 2 x 200 B of moments, 700 B at 1 MB/s: 700 us) from the step's start,
// and l0's gather starts when that update is done.
// OVERLAP: optimizer step                   0.70 ms   0.70 ms of it on the host, beside the next step
// OVERLAP-TRACE:      "dur": 700,
// OVERLAP-TRACE-NEXT: "name": "host optimizer step @l0",
// OVERLAP-TRACE:      "name": "host to device fsdp.all_gather_start @l0",
// OVERLAP-TRACE-NEXT: "ph": "X",
// OVERLAP-TRACE-NEXT: "pid": 1,
// OVERLAP-TRACE-NEXT: "tid": {{[0-9]+}},
// OVERLAP-TRACE-NEXT: "ts": 700

// KIND: error: unknown GPU kind 'b200'; use h100-sxm, h100-96gb, h200, a100-80gb, or custom with memory-gib, tensor-tflops, fp32-tflops, memory-gbps, intra-node-gbps, inter-node-gbps and host-link-gbps
// CUSTOM: error: time model: tensor-tflops must be > 0, got 0
// NEGATIVE: error: time model: memory-gbps must be > 0, got -5
// EFFICIENCY: error: time model: matmul-efficiency must be in (0, 1], got 1.5
// OPTIMIZER: error: unknown optimizer 'lion'

module attributes {fsdp.device = "cuda"} {
  shard.grid @fsdp_grid(shape = 2)
  fsdp.unit @root root
  fsdp.unit @l0
  fsdp.param @w : tensor<1000x1000xbf16> unit @l0 sharded on @fsdp_grid axes = [0] padding = 0
  func.func @train_step(%x: tensor<1000x1000xbf16>, %q: tensor<1x2x1000x64xbf16>) -> tensor<f32> {
    %s = fsdp.get_param @w : tensor<500x1000xbf16>
    %f = fsdp.all_gather_start %s on @fsdp_grid axes = [0] unit @l0 : tensor<500x1000xbf16> -> !fsdp.future<tensor<1000x1000xbf16>>
    %w = fsdp.wait %f : !fsdp.future<tensor<1000x1000xbf16>>
    %y = fsdp.aten "aten::mm" (%x, %w) module "l0" : (tensor<1000x1000xbf16>, tensor<1000x1000xbf16>) -> tensor<1000x1000xbf16>
    %v = fsdp.aten "aten::view" (%q) args [0 : index, [1, 2, 1000, 64]] module "l0" : (tensor<1x2x1000x64xbf16>) -> tensor<1x2x1000x64xbf16>
    %a:2 = fsdp.aten "aten::_scaled_dot_product_flash_attention" (%v, %q, %q) args [0 : index, 1 : index, 2 : index, 0.0, true, false, unit] module "l0" : (tensor<1x2x1000x64xbf16>, tensor<1x2x1000x64xbf16>, tensor<1x2x1000x64xbf16>) -> (tensor<1x2x1000x64xbf16>, tensor<1x2x1000xf32>)
    %l = fsdp.aten "aten::sum" (%y) module "" : (tensor<1000x1000xbf16>) -> tensor<f32>
    fsdp.loss %l : tensor<f32>
    %g = fsdp.aten "aten::mm" (%x, %y) module "l0" : (tensor<1000x1000xbf16>, tensor<1000x1000xbf16>) -> tensor<1000x1000xbf16>
    %r = fsdp.reduce_scatter_start %g on @fsdp_grid axes = [0] reduction = average reduce_dtype = bf16 unit @l0 : tensor<1000x1000xbf16> -> !fsdp.future<tensor<500x1000xbf16>>
    %gs = fsdp.wait %r : !fsdp.future<tensor<500x1000xbf16>>
    fsdp.gradients [@w] %gs : tensor<500x1000xbf16>
    return %l : tensor<f32>
  }
}

// Both units offloaded, the host the bottleneck (1.26 ms of optimizer work,
// 25 us to issue each instruction): beside the next forward the host
// thread waits out the backward; stepping l1 from
// when its gradients land (l1's backward comes first) keeps it busy then,
// and the next step inherits what it has left of l1, before l0.
// BESIDE:        step                             1.71 ms
// LANDED:        step                             1.64 ms
// LANDED:        optimizer step                   1.26 ms   1.26 ms of it on the host, from when gradients land
// LANDED-TRACE:      "name": "host optimizer step @l1",
// LANDED-TRACE-NEXT: "ph": "X",
// LANDED-TRACE-NEXT: "pid": 1,
// LANDED-TRACE-NEXT: "tid": {{[0-9]+}},
// LANDED-TRACE-NEXT: "ts": 0
// LANDED-TRACE:      "name": "host optimizer step @l0",
// LANDED-TRACE:      "name": "host optimizer step @l1 (in backward)",

// Two generated kernels stream their bytes alike, whether an input is
// broadcast or not (the loop reads a broadcast row once per vector): 3 x 4e6 B
// take 120 us at 100 GB/s, 2 x 4e6 B + 4e3 B 80.04 us.
// KERNELS:      "dur": 120,
// KERNELS-NEXT: "name": "pointwise(aten::mul.Tensor)",
// KERNELS:      "dur": 80.04{{[0-9]*}},
// KERNELS-NEXT: "name": "pointwise(aten::mul.Tensor)",

// Issued one instruction at a time, 20 instructions at 25 us bound the
// step; replayed as a CUDA graph, the host issues the launch and the
// batch's copies (three issues) and the kernels run back to back.
// ISSUED:   step                             0.50 ms
// ISSUED:   host-bound                       0.50 ms   compute waiting for the host to issue (20 instructions)
// REPLAYED: step                             0.08 ms
// REPLAYED: host-bound                       0.07 ms   compute waiting for the host to issue (20 instructions)

// A convolution whose backward leaves an output out (before 2026-11-28 the
// time model crashed on the `none` result): forward 2 x 288 outputs x 27
// products, backward as much for the weight's gradient and nothing for the
// input's, 31104 FLOP.
// CONV: "flops": 31104,
// CONV: "aten::convolution_backward": "matmul",
