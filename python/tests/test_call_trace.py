"""The call trace keys a warm start without export (fsdpc/call_trace.py):
it is stable; it changes with whatever changes what export traces (values
the step reads, dataflow, the policy, the units, the target device, torch's
compiling flags, the source files the step ran, code that runs only in
backward); it gives no key where it cannot record the step whole; it
leaves the model and torch as it found them; and a warm `compile_entry`
served from it exports nothing."""

import gc
import importlib.util
import sys
import textwrap
import types
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from fsdpc.capture import MixedPrecision
from fsdpc.export import build, call_trace
from fsdpc.models import BUILTIN_MODELS
from fsdpc.program import Program
from fsdpc.runtime import compile_entry

SCALE = 1.0  # a module global the step reads, as a sweep's setting would be


class Net(nn.Module):
    def __init__(self, residual_from_input=True, config=None):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)
        self.residual_from_input = residual_from_input
        self.config = config or types.SimpleNamespace(activation="relu")

    def forward(self, x):
        h = self.a(x)
        h = F.gelu(h) if self.config.activation == "gelu" else F.relu(h)
        h = self.b(h) + (x if self.residual_from_input else h)
        return self.head(h) * SCALE


def loss(model, x, y):
    return F.cross_entropy(model(x), y)


def meta_step(model_class=Net, rows=4, **kwargs):
    with torch.device("meta"):
        model = model_class(**kwargs)
    batch = (torch.zeros(rows, 8, device="meta"), torch.zeros(rows, dtype=torch.long, device="meta"))
    return model, batch, loss


def fingerprint(model, batch, loss_fn, **options) -> str:
    traced = call_trace(model, batch, loss_fn, **options)
    assert traced is not None, "the step could not be recorded"
    return traced.fingerprint


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_every_builtin_model_is_recorded_the_same_each_time(name):
    for device in ("cpu", "cuda"):
        model, batch, loss_fn = build(BUILTIN_MODELS[name], meta=True)
        first = fingerprint(model, batch, loss_fn, device=device)
        assert fingerprint(model, batch, loss_fn, device=device) == first
        again, again_batch, _ = build(BUILTIN_MODELS[name], meta=True)
        assert fingerprint(again, again_batch, loss_fn, device=device) == first


def test_what_changes_the_traced_step_changes_the_key(monkeypatch):
    base = fingerprint(*meta_step())
    bf16 = MixedPrecision(param_dtype=torch.bfloat16)
    different = {
        "a module global": lambda: (monkeypatch.setattr(sys.modules[__name__], "SCALE", 0.5), fingerprint(*meta_step()))[1],
        "a config object's attribute": lambda: fingerprint(*meta_step(
            config=types.SimpleNamespace(activation="gelu"))),
        "the dataflow": lambda: fingerprint(*meta_step(residual_from_input=False)),
        "the batch's shape": lambda: fingerprint(*meta_step(rows=2)),
        "a value the loss closes over": lambda: fingerprint(*meta_step()[:2], lambda m, x, y: loss(m, x, y) / 2.0),
        "the policy": lambda: fingerprint(*meta_step(), mixed_precision=bf16),
        "the units": lambda: fingerprint(*meta_step(), wrap=lambda name, module: name == "b"),
        "the target device": lambda: fingerprint(*meta_step(), device="cuda"),
        "the autocast around the call": lambda: under_autocast(lambda: fingerprint(*meta_step())),
        "an autocast region in the step": lambda: fingerprint(
            *meta_step()[:2], lambda m, x, y: under_autocast(lambda: loss(m, x, y))),
    }
    keys = {what: change() for what, change in different.items()}
    for what, key in keys.items():
        assert key != base, f"changing {what} kept the key"
    assert len(set(keys.values())) == len(keys)


def under_autocast(run):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return run()


class FlagReader(Net):
    seen: list = []

    def forward(self, x):
        FlagReader.seen.append((torch.compiler.is_compiling(), torch.compiler.is_exporting(), _is_fx_tracing()))
        return super().forward(x) * (2.0 if torch.compiler.is_compiling() else 1.0)


def _is_fx_tracing() -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns that symbolic tracing and export both set it
        return torch.fx._symbolic_trace.is_fx_tracing()


def test_the_step_runs_under_the_flags_export_sets():
    FlagReader.seen = []
    fingerprint(*meta_step(FlagReader))
    assert FlagReader.seen == [(True, True, True)]
    assert not torch.compiler.is_compiling() and not torch.compiler.is_exporting() and not _is_fx_tracing()


def test_the_fx_tracing_flag_is_set_where_each_torch_keeps_it(monkeypatch):
    """torch 2.11 (the GPU hosts') keeps it in a module global, newer torch
    in a thread-local behind accessors (the test above runs that one)."""
    import fsdpc.call_trace as call_trace_module
    older = types.SimpleNamespace(_is_fx_tracing_flag=False)
    monkeypatch.setattr(call_trace_module, "fx_tracing", older)
    get, set_ = call_trace_module._fx_tracing_flag()
    set_(True)
    assert older._is_fx_tracing_flag is True and get() is True
    monkeypatch.setattr(call_trace_module, "fx_tracing", types.SimpleNamespace())
    with pytest.raises(call_trace_module._Incomplete, match="fx tracing flag"):
        call_trace_module._fx_tracing_flag()


MODEL_FILE = '''
import torch
from torch import nn


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * BACKWARD_FACTOR


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return Doubled.apply(self.fc(x))
'''


def load_model_file(path, factor: str):
    path.write_text(textwrap.dedent(MODEL_FILE).replace("BACKWARD_FACTOR", factor))
    spec = importlib.util.spec_from_file_location(f"call_trace_model_{factor}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.device("meta"):
        model = module.Model()
    return model, (torch.zeros(4, 8, device="meta"),)


def test_code_that_runs_only_in_backward_changes_the_key(tmp_path):
    """A custom Function's backward never runs while forward is recorded; the
    file's contents are in the key."""
    path = tmp_path / "model.py"
    summed = lambda model, x: model(x).sum()  # noqa: E731
    first = fingerprint(*load_model_file(path, "2"), summed)
    assert fingerprint(*load_model_file(path, "2"), summed) == first
    assert fingerprint(*load_model_file(path, "3"), summed) != first


class PlainTensorAttribute(Net):
    def __init__(self):
        super().__init__()
        self.offset = torch.ones(4)  # neither a parameter nor a buffer

    def forward(self, x):
        return super().forward(x) + self.offset


class ReadsAValue(Net):
    def forward(self, x):
        return super().forward(x) * x.sum().item()


class HooksAGradient(Net):
    def forward(self, x):
        out = super().forward(x)
        out.register_hook(lambda grad: grad * 2)
        return out


class DrawsWithAGenerator(Net):
    def forward(self, x):
        noise = torch.randn(x.shape, generator=torch.Generator(device="meta"), device="meta")
        return super().forward(x + noise)


def scaled_by(factor):
    """A function of the user's own that torch function modes see (as
    torch's own functions are written), closing over its factor."""
    def scale(x):
        if torch.overrides.has_torch_function((x,)):
            return torch.overrides.handle_torch_function(scale, (x,), x)
        return x * factor
    return scale


class CallsAClosure(Net):
    def forward(self, x):
        return scaled_by(0.5)(super().forward(x))


@pytest.mark.parametrize("model_class", [PlainTensorAttribute, ReadsAValue, HooksAGradient, DrawsWithAGenerator,
                                         CallsAClosure])
def test_a_step_that_cannot_be_recorded_whole_has_no_key(model_class):
    assert call_trace(*meta_step(model_class)) is None


def test_a_model_off_the_meta_device_has_no_key():
    model, batch, _ = meta_step()
    assert call_trace(Net(), tuple(torch.zeros(t.shape, dtype=t.dtype) for t in batch), loss) is None
    assert call_trace(model, tuple(torch.zeros(t.shape, dtype=t.dtype) for t in batch), loss) is None


@pytest.mark.parametrize("model_class", [Net, ReadsAValue])
def test_the_model_and_torch_are_left_as_found(model_class):
    model, batch, loss_fn = meta_step(model_class)
    params = dict(model.named_parameters())
    hooks = (len(nn.modules.module._global_forward_pre_hooks), len(nn.modules.module._global_forward_hooks))
    call_trace(model, batch, loss_fn, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), device="cuda")
    assert not parametrize.is_parametrized(model)
    assert dict(model.named_parameters()) == params
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert (len(nn.modules.module._global_forward_pre_hooks), len(nn.modules.module._global_forward_hooks)) == hooks
    assert not torch.compiler.is_compiling() and not torch.compiler.is_exporting()
    assert gc.isenabled()


class Chatty(Net):
    def forward(self, x):
        print("forward ran")
        return super().forward(x)


def test_what_the_step_prints_is_kept_for_a_start_served_from_the_cache(capsys):
    traced = call_trace(*meta_step(Chatty))
    assert capsys.readouterr().out == ""
    assert traced.printed == "forward ran\n"
    traced.echo()
    assert capsys.readouterr().out == "forward ran\n"


def test_a_warm_start_served_by_the_call_trace_exports_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDPC_CACHE", str(tmp_path))

    def compile_now():
        phases = []
        entry = compile_entry(*meta_step(), options="ranks=2", lap=phases.append)
        return phases, Program.parse(entry["program"])

    cold, program = compile_now()
    assert cold[:3] == ["call trace", "export", "joint trace"]
    warm, served = compile_now()
    assert warm == ["call trace", "cache hit"]
    assert served.text == program.text
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 0.5)
    changed, recompiled = compile_now()
    assert changed[:3] == ["call trace", "export", "joint trace"]
    assert recompiled.text != program.text


def test_a_traced_model_is_freed_by_reference_counting():
    """No reference cycle holds the model after its trace (fsdpc.shard's
    dropped modules must free their process groups at once)."""
    model, batch, loss_fn = meta_step()
    gone = weakref.ref(model)
    collecting = gc.isenabled()
    gc.disable()
    try:
        assert call_trace(model, batch, loss_fn) is not None
        assert call_trace(model, batch, lambda m, x, y: loss(m, x, y) * x.sum().item()) is None
        del model
        assert gone() is None, "the call trace left the model in a reference cycle"
    finally:
        if collecting:
            gc.enable()


def test_an_unexpected_compile_error_says_where_it_was_raised():
    """Ranks other than 0 get rank 0's compile error as a message: an error
    that is not fsdpc's own (which names the user's line) says where it
    was raised; rank 0 raises it chained to the error itself."""
    from fsdpc.capture import CaptureError
    from fsdpc.runtime import _raised_at

    def broken():
        return {}["missing"]

    for error_type, expected in ((KeyError, f" (raised at {__file__}:{broken.__code__.co_firstlineno + 1} in broken)"),
                                 (CaptureError, "")):
        try:
            broken() if error_type is KeyError else _raise(CaptureError("model.py:3: says where"))
        except error_type as error:
            assert _raised_at(error) == expected


def _raise(error: Exception):
    raise error
