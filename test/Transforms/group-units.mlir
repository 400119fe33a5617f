// RUN: fsdp-opt %s --split-input-file --fsdp-group-units="size=2" | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 units-per-group=2" | FileCheck %s --check-prefix=BUCKET
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 units-per-group=2 checkpoint=l1 selective-recompute=false" | FileCheck %s --check-prefix=MEMBER
// RUN: fsdp-opt %s --split-input-file --fsdp-group-units="bucket-mib=0.0001" | FileCheck %s --check-prefix=BYTES
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 unit-bucket-mib=1" | FileCheck %s --check-prefix=PIPELINE
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 unit-bucket-mib=0.00018" | FileCheck %s --check-prefix=ALONE
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 unit-bucket-mib=0.00018 ignored-params=l0.w" | FileCheck %s --check-prefix=IGNORED
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-group-units="bucket-mib=1 ignored-params=l9.w" 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not fsdp-opt %s --split-input-file --fsdp-group-units="size=0" 2>&1 | FileCheck %s --check-prefix=SIZE
// RUN: not fsdp-opt %s --split-input-file --fsdp-group-units="size=2 bucket-mib=1" 2>&1 | FileCheck %s --check-prefix=BOTH
// RUN: not fsdp-opt %s --split-input-file --fsdp-group-units="bucket-mib=-1" 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-group-units="size=2" --fsdp-group-units="size=2" 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=2" --fsdp-group-units="size=2" 2>&1 | FileCheck %s --check-prefix=SHARDED
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 units-per-group=2 offload=l0" 2>&1 | FileCheck %s --check-prefix=OFFLOAD

// Runs of two consecutive non-root units become one; the third stays alone
// and the root is untouched. A group of one class keeps it; of two, none.
// CHECK:      fsdp.unit @root root class "Net"
// CHECK-NEXT: fsdp.unit @"b0+b1" class "Block" members ["b0", "b1"]
// CHECK-NEXT: fsdp.unit @b2 class "Block"
// CHECK-NEXT: fsdp.param @b0.w : tensor<4x4xf32> unit @"b0+b1"
// CHECK-NEXT: fsdp.param @b1.w : tensor<4x4xf32> unit @"b0+b1"
// CHECK-NEXT: fsdp.param @b2.w : tensor<4x4xf32> unit @b2
// CHECK-NEXT: fsdp.param @head : tensor<4x4xf32> unit @root
// CHECK:      fsdp.unit @"a+m" members ["a", "m"]
fsdp.unit @root root class "Net"
fsdp.unit @b0 class "Block"
fsdp.unit @b1 class "Block"
fsdp.unit @b2 class "Block"
fsdp.param @"b0.w" : tensor<4x4xf32> unit @b0
fsdp.param @"b1.w" : tensor<4x4xf32> unit @b1
fsdp.param @"b2.w" : tensor<4x4xf32> unit @b2
fsdp.param @head : tensor<4x4xf32> unit @root

// -----

fsdp.unit @a class "Attention"
fsdp.unit @m class "MLP"
fsdp.param @"a.w" : tensor<4x4xf32> unit @a

// -----

// Buckets of at least 0.0001 MiB (105 bytes): two 64-byte units share one,
// a 1 KiB unit fills one alone.
// BYTES:      fsdp.unit @"u0+u1" members ["u0", "u1"]
// BYTES-NEXT: fsdp.unit @u2{{$}}
// BYTES-NEXT: fsdp.unit @"u3+u4" members ["u3", "u4"]
fsdp.unit @u0
fsdp.unit @u1
fsdp.unit @u2
fsdp.unit @u3
fsdp.unit @u4
fsdp.param @"u0.w" : tensor<4x4xf32> unit @u0
fsdp.param @"u1.w" : tensor<4x4xf32> unit @u1
fsdp.param @"u2.w" : tensor<16x16xf32> unit @u2
fsdp.param @"u3.w" : tensor<4x4xf32> unit @u3
fsdp.param @"u4.w" : tensor<4x4xf32> unit @u4

// The group's three parameters travel in one all-gather and one
// reduce-scatter, named after the group (backward gathers again only l1's
// weight: l0's backward does not read its own).
// BUCKET:     fsdp.all_gather_start %{{.*}}, %{{.*}}, %{{.*}} on @fsdp_grid axes = [0] unit @"l0+l1"
// BUCKET-NOT: fsdp.all_gather_start {{.*}} unit @"l0+l1"
// BUCKET:     fsdp.loss
// BUCKET:     fsdp.all_gather_start %{{[0-9]+}} on @fsdp_grid axes = [0] unit @"l0+l1"
// BUCKET:     fsdp.reduce_scatter_start %{{.*}}, %{{.*}}, %{{.*}} on @fsdp_grid {{.*}} unit @"l0+l1"
// BUCKET-NOT: fsdp.reduce_scatter_start

// Checkpointing still names modules: l1, a member, recomputes alone.
// MEMBER:     fsdp.loss
// MEMBER-NOT: module "l0" {fsdp.recomputed}
// MEMBER:     fsdp.aten "aten::t"(%{{.*}}) module "l1" {fsdp.recomputed}
// MEMBER-NOT: module "l0" {fsdp.recomputed}

// The pipeline's unit-bucket-mib: every unit of the small step fits one MiB.
// PIPELINE: fsdp.unit @"l0+l1" class "Layer" members ["l0", "l1"]

// Buckets of 189 bytes: l0's parameters (200 bytes) fill one alone; with
// its weight ignored (never gathered) l0 counts 40 bytes and shares l1's.
// ALONE-NOT: members
// ALONE:     fsdp.param @l0.w : tensor<10x4xf32> unit @l0 sharded
// IGNORED:     fsdp.unit @"l0+l1" class "Layer" members ["l0", "l1"]
// IGNORED:     fsdp.param @l0.w : tensor<10x4xf32> unit @"l0+l1" ignored

// UNKNOWN: error: fsdp-group-units: ignored-params names 'l9.w', which is no parameter of the step
// SIZE: error: fsdp-group-units: size must be at least 1, got 0
// BOTH: error: fsdp-group-units: bucket-mib must be a non-negative number of MiB, and cannot be given with a size; got bucket-mib=1.00 size=2
// NEGATIVE: error: fsdp-group-units: bucket-mib must be a non-negative number of MiB, and cannot be given with a size; got bucket-mib=-1.00 size=1
// TWICE: error: fsdp-group-units: unit @"l0+l1" is already a group; group the captured units once
// SHARDED: error: fsdp-group-units runs on a captured step, before fsdp-shard-parameters
// OFFLOAD: error: {{.*}}unit 'l0'{{.*}}l0+l1
