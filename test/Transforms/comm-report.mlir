// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" --fsdp-comm-report=backend=nccl -o /dev/null | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" --fsdp-comm-report="format=json output=%t.json backend=nccl" | FileCheck %s --check-prefix=ATTR
// RUN: FileCheck %s --check-prefix=JSON < %t.json
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=8 strategy=no-shard" --fsdp-comm-report=backend=nccl -o /dev/null | FileCheck %s --check-prefix=DDP
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" --fsdp-comm-report -o /dev/null | FileCheck %s --check-prefix=GLOO
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 comm-report=- backend=nccl" -o /dev/null | FileCheck %s
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-comm-report="format=xml" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-comm-report="backend=mpi" 2>&1 | FileCheck %s --check-prefix=BACKEND

// FULL_SHARD on 4 ranks, f32. Gathered (padded): l0 4x(3x4+3)x4 = 240 B,
// l1 160 B, head 64 B in forward, l1 again in backward: 624 B, of which a
// rank sends 3/4. Reduced: l1 160 B + l0 240 B = 400 B, 3/4 sent.
// CHECK:      communication per rank and step: @train_step
// CHECK-NEXT:   all_gather          4 collectives              468 B sent (624 B gathered or reduced)
// CHECK-NEXT:   reduce_scatter      2 collectives              300 B sent (400 B gathered or reduced)
// CHECK-NEXT:   all_reduce          0 collectives                0 B sent (0 B gathered or reduced)
// CHECK-NEXT:   total                                          768 B

// ATTR: fsdp.comm = {all_gather_bytes = 468 : i64, all_gather_count = 4 : i64, all_reduce_bytes = 0 : i64, all_reduce_count = 0 : i64, reduce_scatter_bytes = 300 : i64, reduce_scatter_count = 2 : i64, total_bytes = 768 : i64}

// JSON: "all_gather": {
// JSON-NEXT: "bytes": 468,
// JSON-NEXT: "count": 4,
// JSON-NEXT: "payload_bytes": 624

// NO_SHARD on 8 ranks: all-reduce of the 360 B of trainable gradients,
// 2 x 7/8 of them sent.
// DDP: all_reduce          2 collectives              630 B sent (360 B gathered or reduced)

// On Gloo every collective is an in-place all-reduce of the padded buffer:
// 2 x 3/4 of each.
// GLOO:      all_gather          4 collectives              936 B sent (624 B gathered or reduced)
// GLOO-NEXT: reduce_scatter      2 collectives              600 B sent (400 B gathered or reduced)
// GLOO:      total                                         1536 B

// BAD: error: report format must be table or json, got 'xml'
// BACKEND: error: unknown collective backend 'mpi'; use gloo or nccl
