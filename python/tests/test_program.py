"""The program boundary: what the compiler hands the runtime and the driver
arrives as typed data, exactly; hostile names never become code; damaged
programs fail at load with a message, not a crash."""

import json
import re
from pathlib import Path

import pytest
import torch

from fsdpc.compiler import run_fsdp_opt
from fsdpc.export import export_training_step, load_factory
from fsdpc.program import Program, ProgramError, runtime_extension, translate

HERE = Path(__file__).parent
VERSION = runtime_extension().PROGRAM_VERSION


def compile_program(spec: str, options: str = "ranks=2") -> tuple[torch.nn.Module, Program]:
    torch.manual_seed(0)
    model, batch, loss_fn = load_factory(spec)()
    exported = export_training_step(model, batch, loss_fn)
    sharded = run_fsdp_opt(exported.mlir, [f"--fsdp-sharding-pipeline={options}", "--mlir-print-debuginfo"])
    return model, translate(sharded)


def test_hostile_names_round_trip_through_capture_compile_and_manifest():
    from hostile_names import HOSTILE, HOSTILE_BUFFER

    model, program = compile_program(f"{HERE / 'hostile_names.py'}:make")
    assert [p.name for p in program.params] == [name for name, _ in model.named_parameters()]
    assert HOSTILE in [p.name for p in program.params]
    assert [b.name for b in program.buffers] == [HOSTILE_BUFFER]
    # The name crosses as one JSON string: nothing of it outside string
    # literals, no raw control character anywhere in the document.
    assert not any(ord(c) < 0x20 and c != "\n" for c in program.text)
    names = [i.get("name") for f in json.loads(program.text)["functions"] for i in f["instructions"]]
    assert HOSTILE in names and HOSTILE_BUFFER in names
    # The model keeps its real names after capture.
    assert HOSTILE in dict(model.named_parameters()) and HOSTILE_BUFFER in dict(model.named_buffers())


def test_manifest_describes_the_shard_layout():
    model, program = compile_program("gpt", "ranks=3")
    tok = next(p for p in program.params if p.name == "tok_emb.weight")
    assert tok.shape == (1021, 64) and tok.shard_rows == 341 and tok.padding == 2
    assert tok.tied == ("lm_head.weight",) and tok.unit == "root" and tok.trainable
    (group,) = program.groups.values()
    assert group.members == ((0, 1, 2),) and group.size == 3
    assert program.functions["train_step"].step
    assert program.functions["train_step"].inputs == (((2, 16), "i64"), ((2, 16), "i64"))


def test_the_collective_schedule_digests_the_collectives_not_the_batch():
    """Ranks whose batches differ in size run together where their programs'
    collective schedules agree (sharded.py `_program_among`): the digest is
    the same for another batch size, and changes with what the collectives
    do (an offloaded unit's host gathers, another group)."""
    from fsdpc.models.gpt import GPT, GPTConfig
    from fsdpc.models.language import next_token_loss
    from fsdpc.program import _collective_schedule

    def program(rows: int, seq: int, options: str = "ranks=2") -> Program:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=257, max_seq=32, d_model=32, n_heads=2, n_layers=2))
        batch = tuple(torch.randint(0, 257, (rows, seq)) for _ in range(2))
        exported = export_training_step(model, batch, next_token_loss)
        return translate(run_fsdp_opt(exported.mlir, [f"--fsdp-sharding-pipeline={options}"]))

    schedule = program(2, 16).collective_schedule
    assert program(3, 12).collective_schedule == schedule
    assert program(2, 16, "ranks=2 offload=*").collective_schedule != schedule
    document = json.loads(program(2, 16).text)
    gather = next(i for f in document["functions"] for i in f["instructions"] if i.get("op") == "all_gather")
    gather["group"] = "another"
    assert _collective_schedule(json.dumps(document)) != schedule


def test_ranks_batch_sizes_run_together_only_where_their_collectives_agree():
    """The rule itself, on programs whose schedules differ: refused on every
    rank (each holds every size's program), naming each rank's sizes."""
    from types import SimpleNamespace

    from fsdpc.runtime import StepError
    from fsdpc.sharded import ShardedModule

    programs = {(4, 16): "same", (4, 12): "same", (3, 12): "other"}
    module = SimpleNamespace(_program_for=lambda shapes, **_: SimpleNamespace(program=SimpleNamespace(
        collective_schedule=programs[tuple(shapes[0].shape)])))
    batch = (torch.zeros(4, 16, dtype=torch.long),)
    chosen = ShardedModule._program_among(module, [((4, 16),), ((4, 12),)], batch, train=True, frozen=(), read=None)
    assert chosen.program.collective_schedule == "same"
    with pytest.raises(StepError, match=r"rank 0: \(4, 16\); rank 1: \(3, 12\)\), and the steps compiled for those "
                                        r"sizes issue different collectives"):
        ShardedModule._program_among(module, [((4, 16),), ((3, 12),)], batch, train=True, frozen=(), read=None)


def test_hybrid_groups_list_their_ranks():
    _, program = compile_program("mlp", "ranks=2 replicas=2 strategy=hybrid-shard")
    members = {g.axes: g.members for g in program.groups.values()}
    assert members == {(1,): ((0, 1), (2, 3)), (0,): ((0, 2), (1, 3))}


@pytest.mark.parametrize("damage, message", [
    (lambda t: t.replace(f'"version": {VERSION}', '"version": 99'), "version 99"),
    (lambda t: t.replace('"device": "cpu"', '"device": "tpu"'), "device 'tpu' is not cpu or cuda"),
    (lambda t: t.replace('"device": "cpu"', '"device": "cuda"'), "compiled for cuda and cannot run on cpu"),
    (lambda t: t[: len(t) // 2], "JSON"),
    (lambda t: t.replace('"op":"wait"', '"op":"teleport"', 1), "unknown instruction 'teleport'"),
    (lambda t: t.replace('"name":"aten::mm"', '"name":"aten::no_such_op"', 1), "no ATen operator aten::no_such_op"),
    (lambda t: t.replace('"results":[', '"results":[99999,', 1), "results from a collective of"),
    (lambda t: re.sub(r'"op":"param","result":\d+', '"op":"param","result":-1', t, count=1), "writes slot -1"),
    (lambda t: re.sub(r'"dtypes":\[[^]]*\],([^{]*)"inputs":\[[\d,]*\],("into_results":false,)"op":"all_gather",'
                      r'"shapes":\[[\[\]\d,]*\]',
                      r'"dtypes":[],\1"inputs":[],\2"op":"all_gather","shapes":[]', t, count=1),
     "all_gather takes one or more values"),
    (lambda t: t.replace('"slots": ', '"slots": 4000000000, "x": ', 1), "out of range"),
    (lambda t: t.replace('"slots": ', '"slots": 100000, "x": ', 1), "100000 slots"),
    (lambda t: re.sub(r'"op":"release","values":\[\d+', '"op":"release","values":[-1', t, count=1), "reads slot -1"),
    (lambda t: t.replace('"input_types": [{"dtype":"f32"', '"input_types": [{"dtype":"f80"'), "unknown element type 'f80'"),
    (lambda t: t.replace('"ignored":false', '"ignored":true', 1), "an ignored parameter is neither sharded nor offloaded"),
])
def test_damaged_programs_fail_at_load_with_a_message(damage, message):
    _, program = compile_program("mlp")
    with pytest.raises(RuntimeError, match=message):
        Program.parse(damage(program.text), "cpu")


def test_an_offloaded_shard_is_read_only_by_its_units_host_gather():
    """The host optimizer may be updating an offloaded shard while a step
    runs, and only a host all-gather waits for that: a program that reads
    the shard any other way is refused at load."""
    _, program = compile_program("mlp", "ranks=2 offload=*")
    assert program.functions["train_step"].host_units
    damaged = re.sub(r'"host":true,("inputs":\[[\d,]+\],"into_results":false,"op":"all_gather")', r'"host":false,\1',
                     program.text, count=1)
    assert damaged != program.text
    with pytest.raises(RuntimeError, match="reads the offloaded parameter '[^']+'; only a host all_gather of its unit"):
        Program.parse(damaged, "cpu")


def test_landed_gradients_are_named_and_end_their_units_gathers():
    """A host reduction's wait names the parameter of each gradient it lands
    in host memory, where the host optimizer may step it at once (in
    backward): the names must be offloaded parameters of the reduction's
    unit, each landed once, and no gather of the unit may follow or be in
    flight."""
    _, program = compile_program("mlp", "ranks=2 offload=*")
    landings = re.findall(r'"grads_of":\[([^]]*)\]', program.text)
    landed = [name for names in landings for name in json.loads(f"[{names}]")]
    assert sorted(landed) == sorted(p.name for p in program.params if p.trainable), landed

    def refused(damaged: str, message: str) -> None:
        assert damaged != program.text
        with pytest.raises(RuntimeError, match=message):
            Program.parse(damaged, "cpu")

    first = landings[0].split(",")[0]
    refused(program.text.replace(f'"grads_of":[{first}', '"grads_of":["nowhere"', 1),
            "lands a gradient of 'nowhere', which is not an offloaded parameter of unit")
    refused(program.text.replace(f'"grads_of":[{landings[0]}]', f'"grads_of":[{landings[0]},""]', 1),
            "lands 1 results in host memory but names 2 gradients|lands 2 results in host memory but names 3")
    refused(program.text.replace(f'"grads_of":[{landings[1]}]', f'"grads_of":[{landings[0]}]', 1),
            "not an offloaded parameter of unit|lands the gradient of .* a second time")
    # The device program's waits name nothing they land.
    _, device_program = compile_program("mlp", "ranks=2")
    assert "grads_of" not in device_program.text
    refused_device = device_program.text.replace('"op":"wait"', '"grads_of":["x"],"op":"wait"', 1)
    with pytest.raises(RuntimeError, match="names the gradients it lands, but waits for a collective that does not"):
        Program.parse(refused_device, "cpu")
    # A gather of a unit after its gradients landed reads shards being stepped:
    # the unit's gather again, with its shards read anew, right after the landing.
    document = json.loads(program.text)
    function = document["functions"][0]
    instructions = function["instructions"]
    landing = next(i for i, inst in enumerate(instructions) if "grads_of" in inst)
    reduction = next(inst for inst in instructions[:landing] if inst["op"] == "reduce_scatter"
                     and inst["future"] == instructions[landing]["future"])
    gather = next(inst for inst in instructions if inst["op"] == "all_gather" and inst["unit"] == reduction["unit"])
    shard_of = {inst["result"]: inst["name"] for inst in instructions if inst["op"] == "param"}
    slots, future = function["slots"], function["futures"]
    again = [{"name": shard_of[slot], "op": "param", "result": slots + k} for k, slot in enumerate(gather["inputs"])]
    again.append(dict(gather, inputs=[slots + k for k in range(len(gather["inputs"]))], future=future))
    again.append({"future": future, "op": "wait", "results": [-1] * len(gather["inputs"])})
    instructions[landing + 1:landing + 1] = again
    function["slots"], function["futures"] = slots + len(gather["inputs"]), future + 1
    with pytest.raises(RuntimeError, match=f"gathers unit @{re.escape(reduction['unit'])}'s shards after its "
                                           "gradients landed in host memory"):
        Program.parse(json.dumps(document), "cpu")
    del instructions[landing + 1:landing + 1 + len(again)]
    # Started before the landing and waited for after it: its copy-in may still read the shards.
    instructions[landing:landing] = again[:-1]
    instructions.insert(landing + len(again), again[-1])
    with pytest.raises(RuntimeError, match=f"lands unit @{re.escape(reduction['unit'])}'s gradients while its "
                                           "all-gather is in flight"):
        Program.parse(json.dumps(document), "cpu")
    del instructions[landing + len(again)]
    del instructions[landing:landing + len(again) - 1]
    function["slots"], function["futures"] = slots, future
    Program.parse(json.dumps(document), "cpu")  # as compiled, it loads


def test_a_host_gather_into_its_results_is_refused():
    """A host bucket's shards come in on the host-to-device stream through a
    receive buffer: `into_results` on it is refused at load, as the
    verifier refuses it."""
    _, program = compile_program("mlp", "ranks=2 offload=*")
    damaged = re.sub(r'"host":true,("inputs":\[[\d,]+\],)"into_results":false', r'"host":true,\1"into_results":true',
                     program.text, count=1)
    assert damaged != program.text
    with pytest.raises(RuntimeError, match="a host all_gather gathers through a receive buffer, not into its results"):
        Program.parse(damaged, "cpu")


def test_a_replayed_step_is_refused_where_no_graph_can_capture_it():
    """A function the program replays as a CUDA graph must be a CUDA
    training step whose inputs other than the batch are the same tensors on
    every call, with no host-thread work: the loader refuses the rest, as
    fsdp-cuda-graph does."""
    def replayed(text: str, function: str = "train_step", device: str | None = None) -> str:
        document = json.loads(text)
        if device:
            document["device"] = device
        for entry in document["functions"]:
            if entry["name"] == function:
                entry["cuda_graph"] = True
        return json.dumps(document)

    _, program = compile_program("mlp")
    assert not any(f.cuda_graph for f in program.functions.values())
    assert Program.parse(replayed(program.text, device="cuda")).functions["train_step"].cuda_graph
    with pytest.raises(ProgramError, match="replayed as a CUDA graph, which needs a cuda program; this one is for cpu"):
        Program.parse(replayed(program.text))
    with pytest.raises(ProgramError, match="replayed as a CUDA graph but is not a training step"):
        Program.parse(replayed(program.text.replace('"step": true', '"step": false'), device="cuda"))
    _, offloaded = compile_program("mlp", "ranks=2 offload=*")
    with pytest.raises(ProgramError, match=r"instruction \d+ \(all_gather\) moves an offloaded unit's tensors through "
                                           "host memory"):
        Program.parse(replayed(offloaded.text, device="cuda"))
    _, accumulating = compile_program("mlp", "ranks=2 gradient-accumulation=true")
    with pytest.raises(ProgramError, match="reads an accumulated gradient, new on every call"):
        Program.parse(replayed(accumulating.text, device="cuda"))


def test_the_manifest_reader_rejects_other_documents():
    with pytest.raises(ProgramError, match="not an fsdpc program"):
        Program.parse('{"format": "other", "version": 1}')
    with pytest.raises(ProgramError, match="cannot load the manifest: JSON: missing member \"groups\""):
        Program.parse(json.dumps({"format": "fsdpc.program", "version": VERSION, "device": "cpu"}))


def test_the_reshard_check_catches_a_view_that_outlives_its_buffer():
    """The verifier never lets IR keep a view past its buffer's reshard, so
    this program is written by hand: it gathers a weight, keeps a transposed
    view of it, and reshards the weight while the view is still held."""
    import torch.distributed as dist
    from fsdpc.program import runtime_extension

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.new_group([0])
    text = json.dumps({
        "format": "fsdpc.program", "version": VERSION, "device": "cpu",
        "groups": [{"key": "g", "grid": "world", "grid_shape": [1], "axes": [0], "size": 1, "members": [[0]]}],
        "params": [{"name": "w", "shape": [3, 2], "dtype": "f32", "unit": "root", "trainable": True, "offloaded": False, "ignored": False,
                    "tied": [], "group": "g", "shard_rows": 3, "padding": 0}],
        "buffers": [], "kernels": [],
        "functions": [{
            "name": "leak", "step": False, "cuda_graph": False, "inputs": [], "input_types": [], "slots": 3, "futures": 1,
            "instructions": [
                {"op": "param", "name": "w", "result": 0},
                {"op": "all_gather", "group": "g", "inputs": [0], "shapes": [[3, 2]], "dtypes": ["f32"],
                 "future": 0, "host": False, "into_results": False},
                {"op": "wait", "future": 0, "results": [1]},
                {"op": "aten", "name": "aten::t", "overload": "", "args": [{"tensor": 1}], "results": [2]},
                {"op": "reshard", "values": [1]},
                {"op": "return", "values": [2]}]}]})
    runtime = runtime_extension().Program(text, "cpu")
    weight = torch.arange(6.0).reshape(3, 2)
    out = runtime.run("leak", {"w": weight}, {}, {}, [], {"g": group}, 10.0, check_reshard_frees=True)
    assert out["reshard_leaks"] and "references left" in out["reshard_leaks"][0]
    torch.testing.assert_close(out["returned"][0], weight.t())


def test_a_callers_autocast_does_not_change_what_a_program_computes():
    """Every call's dtypes are the program's: under the caller's
    torch.autocast a matrix product stays fp32 (autocast would compute it in
    bf16 and hand later calls a dtype the program never meant)."""
    text = json.dumps({
        "format": "fsdpc.program", "version": VERSION, "device": "cpu", "groups": [], "params": [], "buffers": [],
        "kernels": [],
        "functions": [{
            "name": "product", "step": False, "cuda_graph": False, "inputs": [0, 1],
            "input_types": [{"shape": [3, 2], "dtype": "f32"}, {"shape": [2, 4], "dtype": "f32"}],
            "slots": 3, "futures": 0,
            "instructions": [
                {"op": "aten", "name": "aten::mm", "overload": "", "args": [{"tensor": 0}, {"tensor": 1}],
                 "results": [2]},
                {"op": "return", "values": [2]}]}]})
    runtime = runtime_extension().Program(text, "cpu")
    a, b = torch.randn(3, 2), torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (under_autocast,) = runtime.run("product", {}, {}, {}, [a, b], {}, 10.0)["returned"]
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, a @ b, rtol=0, atol=0)


@pytest.mark.parametrize("buffer, message", [
    (torch.ones(3), "buffer 'scale' is [3] Float; the step was compiled for [6] f32"),
    (torch.ones(6, dtype=torch.float64), "buffer 'scale' is [6] Double; the step was compiled for [6] f32"),
])
def test_a_buffer_of_another_type_than_compiled_is_refused(buffer, message):
    """The runtime checks the buffers it is handed against the program, as
    it checks the batch (the driver compiles again for a replaced buffer:
    this is the runtime's own guard); a view is read as the row-major
    values the compiler laid out its reads for."""
    text = json.dumps({
        "format": "fsdpc.program", "version": VERSION, "device": "cpu", "groups": [], "params": [],
        "buffers": [{"name": "scale", "shape": [6], "dtype": "f32"}], "kernels": [],
        "functions": [{
            "name": "scaled", "step": False, "cuda_graph": False, "inputs": [0],
            "input_types": [{"shape": [6], "dtype": "f32"}], "slots": 3, "futures": 0,
            "instructions": [
                {"op": "buffer", "name": "scale", "result": 1},
                {"op": "aten", "name": "aten::mul", "overload": "Tensor", "args": [{"tensor": 0}, {"tensor": 1}],
                 "results": [2]},
                {"op": "return", "values": [2]}]}]})
    runtime = runtime_extension().Program(text, "cpu")
    x = torch.arange(6.0)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        runtime.run("scaled", {}, {"scale": buffer}, {}, [x], {}, 10.0)
    strided = torch.arange(12.0).view(6, 2)[:, 0]
    (out,) = runtime.run("scaled", {}, {"scale": strided}, {}, [x], {}, 10.0)["returned"]
    torch.testing.assert_close(out, x * strided, rtol=0, atol=0)


def test_capture_prints_only_element_types_the_runtime_knows():
    """One table of element types crosses the boundary: every dtype the
    capture can print is in the runtime's (fsdp_rt/ElementTypes.h) and the
    runtime maps each to the torch dtype capture meant."""
    from fsdpc.emit import _ELEMENT_TYPES
    from fsdpc.program import runtime_extension

    runtime = set(runtime_extension().element_types())
    assert set(_ELEMENT_TYPES.values()) <= runtime
    for dtype, name in _ELEMENT_TYPES.items():
        text = json.dumps({
            "format": "fsdpc.program", "version": VERSION, "device": "cpu", "groups": [], "params": [], "buffers": [],
            "kernels": [], "functions": [{"name": "f", "step": False, "cuda_graph": False, "inputs": [0], "input_types": [{"shape": [2], "dtype": name}],
                           "slots": 1, "futures": 0, "instructions": [{"op": "return", "values": [0]}]}]})
        value = torch.zeros(2, dtype=dtype)
        out = runtime_extension().Program(text, "cpu").run("f", {}, {}, {}, [value], {}, 10.0)
        assert out["returned"][0].dtype == dtype


@pytest.mark.parametrize("option, message", [
    ("memory-report=/tmp/m.txt", "keeps the memory report itself"),
    ("report-format=table", "keeps the memory report itself"),
    ("comm-report=-", "stdout carries the IR"),
])
def test_pipeline_options_that_would_clash_with_the_driver_are_refused(option, message):
    from fsdpc.runtime import StepError, pipeline_options

    with pytest.raises(StepError, match=message):
        pipeline_options(f"strategy=full-shard {option}", 2)
