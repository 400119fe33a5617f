// RUN: fsdp-opt %S/../Transforms/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" | fsdp-translate --fsdp-to-program | FileCheck %s
// RUN: fsdp-opt %S/../Transforms/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 replicas=2 strategy=hybrid-shard" | fsdp-translate --fsdp-to-program | FileCheck %s --check-prefix=HSDP
// RUN: fsdp-opt %S/../Transforms/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 offload=l0" | fsdp-translate --fsdp-to-program | FileCheck %s --check-prefix=OFFLOAD
// RUN: fsdp-opt %S/../Transforms/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 offload=l0 backend=nccl gather-into-results=true" | fsdp-translate --fsdp-to-program | FileCheck %s --check-prefix=INTO
// RUN: fsdp-opt %S/../Transforms/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 offload=l0 ignored-params=l0.b" | fsdp-translate --fsdp-to-program | FileCheck %s --check-prefix=IGNORED
// RUN: not fsdp-translate --fsdp-to-program %S/../Transforms/Inputs/step.mlir 2>&1 | FileCheck %s --check-prefix=UNSCHEDULED
// RUN: fsdp-opt %s --fsdp-plan-lifetimes | fsdp-translate --fsdp-to-program | FileCheck %s --check-prefix=LITERALS

// The manifest: groups with their member ranks, parameters with their shard
// layout (l0.w's 10 rows take 3 per rank, 2 rows of padding), then one
// instruction per op: shard reads, bucketed collectives, ATen calls with
// their source line, and the drops that fsdp-plan-lifetimes decided.
// CHECK:      {"format": "fsdpc.program", "version": 10, "device": "cpu",
// CHECK-NEXT:  "groups": [
// CHECK-NEXT:    {"axes":[0],"grid":"fsdp_grid","grid_shape":[4],"key":"fsdp_grid:0","members":{{\[\[}}0,1,2,3{{\]\]}},"size":4}
// CHECK:       "params": [
// CHECK-NEXT:    {"dtype":"f32","group":"fsdp_grid:0","ignored":false,"name":"l0.w","offloaded":false,"padding":2,"shape":[10,4],"shard_rows":3,"tied":[],"trainable":true,"unit":"l0"},
// CHECK:         {"dtype":"f32","group":"fsdp_grid:0","ignored":false,"name":"head","offloaded":false,"padding":1,"shape":[3,4],"shard_rows":1,"tied":[],"trainable":false,"unit":"root"}
// CHECK:       "kernels": [
// CHECK-NEXT:  ],
// CHECK-NEXT:  "functions": [
// CHECK-NEXT:   {"cuda_graph": false, "futures": 6, "input_types": [{"dtype":"f32","shape":[2,4]}], "inputs": [0], "name": "train_step", "slots": {{[0-9]+}}, "step": true,
// CHECK-NEXT:    "instructions": [
// CHECK-NEXT:      {"name":"l0.b","op":"param","result":1},
// CHECK-NEXT:      {"name":"l0.w","op":"param","result":2},
// CHECK-NEXT:      {"dtypes":["f32","f32"],"future":0,"group":"fsdp_grid:0","host":false,"inputs":[2,1],"into_results":false,"op":"all_gather","shapes":{{\[\[}}10,4],[10]],"unit":"l0"},
// CHECK-NEXT:      {"op":"release","values":[1,2]},
// CHECK-NEXT:      {"future":0,"op":"wait","results":[3,4]},
// CHECK:           {"args":[{"tensor":4},{"tensor":0},{"tensor":3}],"loc":"{{[^"]*}}:{{[0-9]+}}","name":"aten::addmm","op":"aten","overload":"","results":[6]},
// CHECK-NEXT:      {"op":"reshard","values":[4]},
// CHECK:           {"args":[{"ints":[2,3]},{"dtype":"f32"}],{{.*}}"name":"aten::ones"
// CHECK:           {"dtypes":["f32"],"future":{{[0-9]}},"group":"fsdp_grid:0","host":false,"inputs":[{{[0-9]+}}],"op":"reduce_scatter","post_divide":1,"pre_divide":1,"reduce_dtype":"f32","reduction":"average","shapes":{{\[\[}}1,10]],"unit":"l1"},
// CHECK:           {"inputs":[{{[0-9]+}},{{[0-9]+}},{{[0-9]+}}],"op":"gradients","params":["l0.w","l0.b","l1.w"]},

// An offloaded unit: its parameters say so, and its all-gather reads from and
// its reduce-scatter delivers to host memory.
// OFFLOAD:     {"dtype":"f32","group":"fsdp_grid:0","ignored":false,"name":"l0.w","offloaded":true,
// OFFLOAD:     {"dtype":"f32","group":"fsdp_grid:0","ignored":false,"name":"l1.w","offloaded":false,
// OFFLOAD:     "host":true,"inputs":[2,1],"into_results":false,"op":"all_gather","shapes":{{\[\[}}10,4],[10]],"unit":"l0"}
// OFFLOAD:     "host":false,{{.*}}"op":"all_gather",{{.*}}"unit":"l1"}
// OFFLOAD:     "future":[[FUTURE:[0-9]+]],"group":"fsdp_grid:0","host":true,{{.*}}"op":"reduce_scatter",{{.*}}"unit":"l0"}
// The wait that lands the gradients names whose they are, for a host
// optimizer stepping in backward; a device reduction's wait names none.
// OFFLOAD:     {"future":[[FUTURE]],"grads_of":["l0.w","l0.b"],"op":"wait","results":
// OFFLOAD-NOT: "grads_of"

// An ignored parameter is whole (no group) and stays on the device, though
// its unit is offloaded; its unit's host gather and reduction leave it out.
// IGNORED:     {"dtype":"f32","group":"fsdp_grid:0","ignored":false,"name":"l0.w","offloaded":true,
// IGNORED:     {"dtype":"f32","group":null,"ignored":true,"name":"l0.b","offloaded":false,"shape":[10],"tied":[],"trainable":true,"unit":"l0"},
// IGNORED:     "host":true,"inputs":[{{[0-9]+}}],"into_results":false,"op":"all_gather","shapes":{{\[\[}}10,4]],"unit":"l0"}
// IGNORED:     {"future":{{[0-9]+}},"grads_of":["l0.w"],"op":"wait","results":

// Gathered into the results, but not an offloaded unit's bucket.
// INTO:     "host":true,"inputs":[2,1],"into_results":false,"op":"all_gather",{{.*}}"unit":"l0"}
// INTO:     "host":false,{{.*}}"into_results":true,"op":"all_gather",{{.*}}"unit":"l1"}

// Hybrid sharding: the 2x2 grid's rows and columns, each group with its ranks.
// HSDP:    {"axes":[1],"grid":"fsdp_grid","grid_shape":[2,2],"key":"fsdp_grid:1","members":{{\[\[}}0,1],[2,3]],"size":2}
// HSDP:    {"axes":[0],"grid":"fsdp_grid","grid_shape":[2,2],"key":"fsdp_grid:0","members":{{\[\[}}0,2],[1,3]],"size":2}
// HSDP:    "op":"all_reduce"

// UNSCHEDULED: error: fsdp-to-program: run fsdp-verify-schedule (or the sharding pipeline) first

// Every literal kind, tagged; a parameter name with quotes, a backslash,
// a newline, NUL and non-ASCII stays one escaped JSON string.
// LITERALS: {"dtype":"f32","group":null,"ignored":false,"name":"a\"b\\\nc\u0000dé","offloaded":false,"shape":[4]
// LITERALS-LABEL: "name": "literals"
// LITERALS: {"name":"a\"b\\\nc\u0000dé","op":"param","result":1},
// LITERALS: {"args":[{"tensor":0},{"bools":[true,false,true]},{"floats":[1.5,2]},{"ints":[]},{"float":"nan"},{"float":"-inf"},{"int":-3},{"bool":false},{"string":"channels_last"},{"dtype":"bf16"},null,{"tensors":[1,null]},{"string":"<device>"}],"loc":"{{[^"]*}}","name":"test::literals","op":"aten","overload":"","results":[2]}
// LITERALS-NEXT: {"op":"release","values":[0,1]},
// LITERALS-NEXT: {"op":"return","values":[2]}
fsdp.unit @root root
fsdp.param @"a\"b\\\0Ac\00d\C3\A9" : tensor<4xf32> unit @root
func.func @literals(%x: tensor<4xf32>) -> tensor<4xf32> {
  %w = fsdp.get_param @"a\"b\\\0Ac\00d\C3\A9" : tensor<4xf32>
  %y = fsdp.aten "test::literals" (%x, %w) args [0 : index, [true, false, true], [1.5, 2.0], [], 0x7FF8000000000000 : f64, 0xFFF0000000000000 : f64, -3, false, "channels_last", bf16, unit, [1 : index, unit], "<device>"]
      : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}
