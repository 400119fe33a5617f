// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 strategy=shard-grad-op forward-prefetch=0" | FileCheck %s --check-prefix=ZERO2
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 replicas=2 strategy=hybrid-shard reshard-root=true checkpoint=l0 gradient-accumulation=true reduce-dtype=bf16" | FileCheck %s --check-prefix=ALL
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 memory-report=- comm-report=- report-format=json" -o /dev/null | FileCheck %s --check-prefix=REPORTS
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 reshard-after-forward=maybe" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 backend=nccl" | FileCheck %s --check-prefix=NCCL
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 backend=gloo" | FileCheck %s --check-prefix=GLOO
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 backend=nccl gather-into-results=false" | FileCheck %s --check-prefix=STAGED
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 gather-into-results=maybe" 2>&1 | FileCheck %s --check-prefix=BAD-INTO

// The default: FULL_SHARD, one bucket per unit and phase, depth-1 prefetch,
// verified and hashed.
// CHECK:      shard.grid @fsdp_grid(shape = 4)
// CHECK:      func.func @train_step({{.*}} attributes {fsdp.collective_count = 6 : i64, fsdp.collective_hash
// CHECK:      fsdp.all_gather_start %{{.*}}, %{{.*}} on @fsdp_grid axes = [0] unit @l0 :
// CHECK:      fsdp.all_gather_start %{{.*}} unit @l1 prefetch 1
// CHECK:      fsdp.all_gather_start %{{.*}} unit @root prefetch 1
// CHECK:      fsdp.loss
// CHECK:      fsdp.all_gather_start %{{.*}} unit @l1 :
// CHECK:      fsdp.reduce_scatter_start %{{.*}} unit @l1
// CHECK:      fsdp.reduce_scatter_start %{{.*}}, %{{.*}} on @fsdp_grid axes = [0] reduction = average reduce_dtype = f32 unit @l0

// SHARD_GRAD_OP: parameters stay gathered through backward.
// ZERO2:     fsdp.collective_count = 5
// ZERO2:     fsdp.loss
// ZERO2-NOT: fsdp.all_gather_start

// Every knob at once.
// ALL:      shard.grid @fsdp_grid(shape = 2x2)
// ALL:      func.func @train_step(
// ALL:      fsdp.get_param @head
// ALL:      fsdp.loss
// ALL:      fsdp.all_gather_start {{.*}} unit @root
// ALL:      fsdp.get_accumulated_grad
// ALL:      fsdp.reduce_scatter_start {{.*}} axes = [1] reduction = average reduce_dtype = bf16
// ALL:      fsdp.all_reduce_start {{.*}} axes = [0] reduction = average reduce_dtype = bf16
// ALL:      func.func @train_step_no_sync(
// ALL:      fsdp.gradients {{.*}} unreduced

// REPORTS: "optimizer": "adamw",
// REPORTS: "collectives": {

// BAD: error: reshard-after-forward mode must be true, false or a positive integer, got 'maybe'

// On NCCL the all-gathers write into their results unless told otherwise
// (gather-into-results=default); on Gloo they do not.
// GLOO-NOT:  into_results
// NCCL:      fsdp.all_gather_start {{.*}} into_results
// STAGED-NOT: into_results

// BAD-INTO: Cannot find option named 'maybe'!
