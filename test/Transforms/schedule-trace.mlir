// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" --fsdp-schedule-trace="output=%t.json" -o /dev/null
// RUN: FileCheck %s < %t.json
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-schedule-trace="network-gbps=0" 2>&1 | FileCheck %s --check-prefix=BAD

// Chrome trace events: named tracks, one complete event per op, collectives
// on their own tracks, each named after its unit. l0's bucket is 200 B:
// 10 us latency + 200 B at 50 GB/s.
// CHECK: "displayTimeUnit": "ns",
// CHECK: "traceEvents": [
// CHECK: "name": "@train_step"
// CHECK: "name": "process_name",
// CHECK: "name": "compute"
// CHECK: "name": "thread_name",
// CHECK: "name": "all_gather"
// CHECK: "bytes": 200
// CHECK: "dur": 10.004,
// CHECK-NEXT: "name": "fsdp.all_gather_start unit @l0",
// CHECK-NEXT: "ph": "X",
// CHECK-NEXT: "pid": 1,
// CHECK-NEXT: "tid": 2,
// CHECK: "name": "aten::addmm",
// CHECK: "name": "fsdp.reduce_scatter_start unit @l1",
// CHECK-NEXT: "ph": "X",
// CHECK-NEXT: "pid": 1,
// CHECK-NEXT: "tid": 3,

// BAD: error: trace cost model: bandwidths must be > 0 and latency >= 0
