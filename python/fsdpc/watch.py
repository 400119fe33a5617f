"""What the compiled step holds that Python may change, and what it cannot
hold at all.

Capture runs the step's Python once: every plain value it reads (a module's
dropout `p`, a Hugging Face `config.use_cache`, a loss weight in a global or
closure, a loss module's `label_smoothing`) is compiled in as the value it
had. The sharded module reads those values again before every call and keys
its programs by them, as torch.compile's guards would, so a change compiles
(or loads) the step for the new value instead of silently keeping the old.

Module attributes and configuration objects are found by watching reads
while capture runs (capture's `_attribute_reads`); what the loss function
and the model's own forwards read from outside themselves is found in their
code (`free_variables`), which also names the variable behind a capture
that failed on a tensor from outside the model (capture's `outside_tensor`).
"""

from __future__ import annotations

import argparse
import dis
import enum
import functools
import inspect
import os
import site
import sys
import sysconfig
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn

# Where code is not the user's: torch's, and fsdpc's own outside its models.
# Folders end with the separator, so that a prefix test does not take `fsdpc_runs/` for `fsdpc/`.
TORCH_DIR = os.path.join(os.path.dirname(torch.__file__), "")
FSDPC_DIR = os.path.join(os.path.dirname(__file__), "")
FSDPC_MODELS_DIR = os.path.join(FSDPC_DIR, "models", "")  # the built-in models are code like the user's

# Values the compiled step holds as constants when forward reads them.
_PLAIN_VALUES = frozenset({bool, int, float, str, type(None)})
# What nn.Module itself keeps in every module's __dict__ (`training` keys programs apart).
MODULE_INTERNALS = frozenset(vars(nn.Module()))


class Marker:
    """A value standing for something that is not a value in programs'
    keys, equal only to itself and printed the same on every rank (keys
    are compared across ranks as text)."""

    def __init__(self, text: str):
        self._text = text

    def __repr__(self) -> str:
        return self._text


# A read value that the compiled step does not hold as a constant.
UNWATCHED = Marker("<not watched>")


# How deep watched_value looks into tuples, lists and dicts held in each other.
_NESTING = 4
# Values of other kinds that key programs as they are.
_ALSO_PLAIN = (enum.Enum, torch.dtype, torch.device)


def watched_value(value, depth: int = 0):
    """`value` as the programs compiled with it are keyed by: a plain value
    itself (also an enum member, a torch dtype or device, a numpy scalar as
    its type and value); a tuple, list or dict (a loop's `HP["weight"]`) as
    a tuple of its items' watched values (snapshots: one edited in place
    must compare unequal), where any is watched or it is empty; anything
    else `UNWATCHED` (also inside a container: its other items are watched)."""
    kind = type(value)
    if kind in _PLAIN_VALUES:
        return value
    if kind in (tuple, list, dict):
        if depth >= _NESTING:
            return UNWATCHED
        keyed = kind is dict
        items = tuple((key, watched_value(item, depth + 1)) if keyed else watched_value(item, depth + 1)
                      for key, item in (value.items() if keyed else enumerate(value)))
        if items and all((item[1] if keyed else item) is UNWATCHED for item in items):
            return UNWATCHED
        return ("dict", items) if keyed else items
    if isinstance(value, _ALSO_PLAIN):
        return value
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):  # np.float64(0.5): the step holds it as 0.5
        return (kind.__name__, value.item())
    return UNWATCHED


def read_attribute(module: nn.Module, dotted: str, absent):
    """The current value of a watched read: `dotted` is an attribute of
    `module` (`scale`) or of a configuration object it holds
    (`config.use_cache`, `config.text_config.rope_theta`); `absent` where
    any link is gone; a property that raises gives its error's type (as
    `_attribute_now`), never the call's failure."""
    value = module
    for name in dotted.split("."):
        try:
            value = getattr(value, name, absent)
        except Exception as error:  # a user's property may raise anything
            return f"<raises {type(error).__name__}>"
        if value is absent:
            return absent
    return watched_value(value)


def is_configuration(value) -> bool:
    """A configuration object of the kind models keep and their forwards
    read (a dataclass instance, a Hugging Face PretrainedConfig, an argparse
    namespace, an instance of a plain class of the user's): its reads are
    watched like a module's own attributes."""
    kind = type(value)
    return (not isinstance(value, type) and hasattr(value, "__dict__")
            and (hasattr(kind, "__dataclass_fields__") or isinstance(value, argparse.Namespace)
                 or any(base.__module__.startswith("transformers.") and base.__name__ in
                        ("PretrainedConfig", "PreTrainedConfig") for base in kind.__mro__)
                 or _settings_class(kind)))


# Objects that only hold settings: all their plain attributes are watched.
_NAMESPACES = (argparse.Namespace, types.SimpleNamespace)


def _holds_settings(value) -> bool:
    """What loss_fn's and the forwards' code may read settings off, by
    attribute: a configuration object, a namespace (`args.weight` of
    argparse), a class or an instance of a class of the user's
    (`Config.weight`), or a module of the user's (`import config`,
    `config.weight`)."""
    if is_configuration(value) or isinstance(value, _NAMESPACES):
        return True
    if isinstance(value, types.ModuleType):
        path = getattr(value, "__file__", None)
        return bool(path) and user_file(path)
    return _settings_class(value if isinstance(value, type) else type(value))


def _settings_class(kind: type) -> bool:
    """A class of the user's that is not a module, a Function or a tensor."""
    if issubclass(kind, (nn.Module, torch.autograd.Function, torch.Tensor)):
        return False
    if kind.__module__ == "__main__":  # the script's, also where `__main__` is not its module (cProfile, notebooks)
        return True
    try:
        defined_in = inspect.getfile(kind)
    except (TypeError, OSError):  # a builtin or a class made at run time
        return False
    return user_file(defined_in)


def configurations(model: nn.Module) -> dict[int, tuple[object, str, str]]:
    """The configuration objects the model's modules hold (and those they
    hold in turn, a multimodal config's `text_config`), by id: (the object,
    the path of the first module holding it, the attribute path from there)."""
    found: dict[int, tuple[object, str, str]] = {}

    def visit(value, path: str, dotted: str) -> None:
        if id(value) in found or not is_configuration(value):
            return
        found[id(value)] = (value, path, dotted)
        for name, inner in list(vars(value).items()):
            visit(inner, path, f"{dotted}.{name}")

    for path, module in model.named_modules(remove_duplicate=False):
        for name, value in list(vars(module).items()):
            if name not in MODULE_INTERNALS:
                visit(value, path, name)
    return found


_STANDARD_DIR = os.path.join(os.path.abspath(sysconfig.get_paths()["stdlib"]), "")
# Installed packages, the user's own site-packages included.
_LIBRARY_DIRS = tuple({os.path.join(os.path.abspath(path), "") for path in (
    sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], site.getusersitepackages())})


def machinery_file(path: str) -> bool:
    """Code of torch's, Python's standard library's or fsdpc's own (outside
    its models): what runs a step, not what the step computes."""
    path = os.path.abspath(path)
    return ((path.startswith(FSDPC_DIR) and not path.startswith(FSDPC_MODELS_DIR)) or path.startswith(TORCH_DIR)
            or path.startswith(_STANDARD_DIR))


def user_stacklevel() -> int:
    """`warnings.warn`'s stacklevel, for the function that calls this, that
    names the innermost line outside the machinery: the user's call, however
    deep under nn.Module's and fsdpc's own calls the warning is raised."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and machinery_file(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def user_file(path: str) -> bool:
    """A file of the user's: not an installed library's nor the machinery's."""
    return not (machinery_file(path) or os.path.abspath(path).startswith(_LIBRARY_DIRS))


def user_function(value) -> bool:
    """A Python function of the user's (not an installed library's nor the
    machinery's): its globals and closure are the user's too."""
    return isinstance(value, types.FunctionType) and user_file(value.__code__.co_filename)


def _user_autograd_function(value) -> bool:
    """A custom torch.autograd.Function class of the user's."""
    return (isinstance(value, type) and issubclass(value, torch.autograd.Function)
            and user_function(getattr(value, "forward", None)))


def nested_codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and the code of the functions, lambdas and comprehensions in it."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from nested_codes(constant)


# Instructions that push a named variable, after which a LOAD_ATTR reads an attribute of it.
_NAMED_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FAST",
                          "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_FAST_AND_CLEAR"})
# Python 3.13's pairs of local loads (argval: both names); the second is on top, where LOAD_ATTR reads.
_PAIRED_LOADS = frozenset({"LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW", "STORE_FAST_LOAD_FAST"})
_ASSIGNMENTS = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF", "STORE_ATTR",
                          "DELETE_ATTR"})


@dataclass
class _CodeReads:
    """What a function's code (nested functions, lambdas and comprehensions
    included) may read, each with the first line reading it, leaving out
    what it assigns (a counter it keeps is no setting)."""

    globals: dict[str, int]
    closure: dict[str, int]
    # Attributes read right off a variable or an attribute chain (`cfg` ->
    # {`smoothing`}, `self.cfg` -> {`scale`}), by the variable or chain.
    attributes_of: dict[str, dict[str, int]]
    # What it assigns outside itself, ("global", name), ("closure variable",
    # name) or ("attribute", name) of its first argument, with the line.
    assigns: dict[tuple[str, str], int] = field(default_factory=dict)


def _code_reads(function: types.FunctionType) -> _CodeReads:
    globals_read: dict[str, int] = {}
    closure_read: dict[str, int] = {}
    attributes_of: dict[str, dict[str, int]] = {}
    assigned: set[str] = set()
    assigns: dict[tuple[str, str], int] = {}
    first = function.__code__.co_varnames[0] if function.__code__.co_argcount else None
    line = function.__code__.co_firstlineno
    for code in nested_codes(function.__code__):
        chain = None  # the variable or attribute chain the last instructions pushed
        for instruction in dis.get_instructions(code):
            line = getattr(instruction.positions, "lineno", None) or line
            name, opname = instruction.argval, instruction.opname
            if opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                globals_read.setdefault(name, line)
            elif opname in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
                closure_read.setdefault(name, line)
            elif opname in _ASSIGNMENTS:
                assigned.add(name)
                if opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                    assigns.setdefault(("global", name), line)
                elif opname in ("STORE_DEREF", "DELETE_DEREF") and name in code.co_freevars \
                        and code is function.__code__:
                    assigns.setdefault(("closure variable", name), line)
                elif chain == first and code is function.__code__:
                    assigns.setdefault(("attribute", name), line)
            if opname in ("LOAD_ATTR", "LOAD_METHOD") and chain is not None:
                attributes_of.setdefault(chain, {}).setdefault(name, line)
                chain = f"{chain}.{name}"
            elif opname in _PAIRED_LOADS:
                chain = name[1]
            else:
                chain = name if opname in _NAMED_LOADS else None
    return _CodeReads({name: at for name, at in globals_read.items() if name not in assigned},
                      {name: at for name, at in closure_read.items() if name not in assigned},
                      {of: {name: at for name, at in read.items() if name not in assigned}
                       for of, read in attributes_of.items()}, assigns)


def _users_method(kind: type, name: str) -> types.FunctionType | None:
    """The function of the user's behind `kind`'s method, static or class
    method, or property `name`; None for anything else."""
    held = inspect.getattr_static(kind, name, None)
    function = held.fget if isinstance(held, property) else getattr(held, "__func__", held)
    return function if user_function(function) else None


def free_variables(loss_fn: Callable, model: nn.Module, assignments: list[str] | None = None
                   ) -> Iterator[tuple[str, Callable[[], object], set[str], str]]:
    """What the loss function and the forwards of the model's own module
    classes read from outside themselves, found in their code without
    running it (what the code may read and does not assign): globals and
    closure variables, a callable loss object's or a bound method's
    object's attributes, the values a functools.partial binds, and the same
    for the functions of the user's that they call by name (a module's own
    attributes are watched as forward reads them). Each as (what it is, how
    to read its value now, the attribute names the code reads off it, the
    file and line reading it). What the code assigns outside itself is
    added to `assignments`, said as "file:line: who assigns what"."""
    seen: set[int] = set()

    def visit(function, described: str, depth: int, on_context: bool = False, cls: type | None = None):
        """`on_context`: a custom Function's forward or backward, whose first
        argument is its `ctx` (what it sets there is its own, for backward).
        `cls`: the class whose method an unbound `function` is (a module
        class's forward), for the helper methods it calls on `self`."""
        if id(function) in seen or depth > 3:
            return
        seen.add(id(function))
        if isinstance(function, functools.partial):
            inner = function.func
            reads = _code_reads(inner) if user_function(inner) else _CodeReads({}, {}, {})
            parameters = inner.__code__.co_varnames if isinstance(inner, types.FunctionType) else ()
            where = (f"{inner.__code__.co_filename}:{inner.__code__.co_firstlineno}"
                     if isinstance(inner, types.FunctionType) else "functools.partial")
            # Read now, not at the first call: a loop may change `partial.keywords` in place.
            bound = [(parameters[index] if index < len(parameters) else str(index),
                      lambda value=value: value) for index, value in enumerate(function.args)]
            bound += [(name, lambda name=name, keywords=function.keywords: keywords.get(name, _ABSENT_NAME))
                      for name in function.keywords]
            for name, read_now in bound:
                yield (f"{described}'s bound argument '{name}'", read_now,
                       set(reads.attributes_of.get(name, ())), where)
            yield from visit(inner, described, depth + 1)
            return
        owner = None
        if isinstance(function, types.MethodType):
            owner, function = function.__self__, function.__func__
        elif not isinstance(function, types.FunctionType):  # a callable object (a module: its forward)
            owner, function = function, getattr(type(function), "forward" if isinstance(function, nn.Module)
                                                else "__call__", None)
        if not user_function(function):
            return
        reads = _code_reads(function)
        where = function.__code__.co_filename
        code = function.__code__
        if assignments is not None:
            assignments.extend(f"{where}:{line}: {described} assigns the {kind} '{name}'"
                               for (kind, name), line in reads.assigns.items()
                               if not (on_context and kind == "attribute"))
        if owner is not None and code.co_argcount:
            itself = code.co_varnames[0]  # `self`
            for name, line in sorted(reads.attributes_of.get(itself, {}).items()):
                if name in getattr(owner, "__dict__", ()):
                    yield (f"{described}'s attribute '{name}'", lambda name=name: getattr(owner, name, _ABSENT_NAME),
                           set(reads.attributes_of.get(f"{itself}.{name}", ())), f"{where}:{line}")
        kind = type(owner) if owner is not None else cls
        if kind is not None and code.co_argcount and not on_context:  # `self._attend(x)`, `self.scale_now`
            for name in sorted(reads.attributes_of.get(code.co_varnames[0], {})):
                method = _users_method(kind, name)
                if method is not None:
                    yield from visit(method if owner is None else types.MethodType(method, owner),
                                     f"{kind.__name__}.{name} (called by {described})", depth + 1, cls=kind)
        namespace = function.__globals__
        for name, line in reads.globals.items():
            if name not in namespace:  # a builtin
                continue
            value = namespace[name]
            called = reached(value, described, depth)
            if called is not None:  # which function it holds keys the programs too (a loop may swap it)
                yield (f"{described}'s global '{name}'", lambda name=name: namespace.get(name, _ABSENT_NAME),
                       set(), f"{where}:{line}")
                yield from called
            else:
                yield (f"{described}'s global '{name}'", lambda name=name: namespace.get(name, _ABSENT_NAME),
                       set(reads.attributes_of.get(name, ())), f"{where}:{line}")
        for name, cell in zip(code.co_freevars, function.__closure__ or ()):
            if name not in reads.closure:  # only assigned (a nonlocal counter)
                continue
            value = cell_value(cell)
            called = reached(value, described, depth)
            if called is not None:
                yield (f"{described}'s closure variable '{name}'", lambda cell=cell: cell_value(cell), set(),
                       f"{where}:{reads.closure[name]}")
                yield from called
            else:
                yield (f"{described}'s closure variable '{name}'", lambda cell=cell: cell_value(cell),
                       set(reads.attributes_of.get(name, ())), f"{where}:{reads.closure[name]}")

    def reached(value, described: str, depth: int):
        """The reads of `value` where the code calls it (a function of the
        user's; a custom autograd Function's forward and backward, which run
        in the step as the calling code does); None for any other value."""
        if user_function(value):
            return visit(value, f"{value.__qualname__} (called by {described})", depth + 1)
        if _user_autograd_function(value):
            return (read for method in ("forward", "backward")
                    for read in visit(getattr(value, method, None),
                                      f"{value.__qualname__}.{method} (called by {described})", depth + 1,
                                      on_context=True))
        return None

    yield from visit(loss_fn, "loss_fn", 0)
    for kind in dict.fromkeys(type(module) for module in model.modules()):
        yield from visit(getattr(kind, "forward", None), f"{kind.__name__}.forward", 0, cls=kind)
    # Forward hooks registered before fsdpc.shard are traced into the step: what they read is the step's too.
    for path, module in model.named_modules():
        for hook in (*module._forward_pre_hooks.values(), *module._forward_hooks.values()):
            yield from visit(hook, f"a forward hook of {path or 'the model'}", 0)
    # A Function the model holds (`self.fn = MyFunction`, or as a class
    # attribute) is called as `self.fn.apply(...)`, which the code does not name.
    for module in model.modules():
        held = {name: value for kind in reversed(type(module).__mro__[:-1]) if kind is not nn.Module
                for name, value in vars(kind).items()}
        held.update(vars(module))
        for name, value in held.items():
            if _user_autograd_function(value):
                yield from reached(value, f"{type(module).__name__}.{name}", 0)


def free_variable_reads(loss_fn: Callable, model: nn.Module) -> list[tuple[str, Callable[[], object]]]:
    """The plain values the loss function and the model's forwards read
    from outside themselves (`free_variables`), which the compiled step
    holds as constants: a weight the loop anneals, a label smoothing a
    sweep sets, the attributes the code reads of a configuration object.
    Each as (what it is, how to read its value now): the sharded module
    keys the programs by them, as by module attributes."""
    reads: dict[str, Callable[[], object]] = {}
    inside = {id(module) for module in model.modules()}
    if isinstance(loss_fn, nn.Module) and id(loss_fn) not in inside:  # its submodules' settings too
        reads["loss_fn's settings"] = lambda: _module_settings(loss_fn)

    def value_of(value, attributes: set[str]):
        watched = watched_value(value)
        if watched is not UNWATCHED:
            return watched
        if _holds_settings(value):  # the attributes the code reads off it, properties and aliases included
            names = set(attributes) | (set(vars(value)) if isinstance(value, _NAMESPACES) else set())
            read = {name: _attribute_now(value, name) for name in sorted(names)}
            return tuple((name, inner) for name, inner in read.items() if inner is not UNWATCHED)
        if isinstance(value, nn.Module):  # a loss module (its label smoothing): torch's code reads it
            return _module_settings(value)
        if user_function(value) or _user_autograd_function(value):  # by name and line: the same on every host
            closed = _closure_values(value)
            return f"{value.__qualname__} at line {_first_line(value)}" + (f" closing over {closed!r}" if closed else "")
        return type(value).__name__  # not a setting; a different kind of value since is a change

    for described, read_now, attributes, _ in free_variables(loss_fn, model):
        value = read_now()
        if watched_value(value) is not UNWATCHED or _holds_settings(value) or user_function(value) \
                or _user_autograd_function(value) or (isinstance(value, nn.Module) and id(value) not in inside):
            reads.setdefault(described, lambda read_now=read_now, attributes=attributes:
                             value_of(read_now(), attributes))
    return list(reads.items())


def _attribute_now(value, name: str):
    """`value.name` as a watched value; a property that raises is a value
    too (its error's type), never the call's failure."""
    try:
        return watched_value(getattr(value, name, UNWATCHED))
    except Exception as error:  # a user's property may raise anything
        return f"<raises {type(error).__name__}>"


def _closure_values(value) -> tuple:
    """The plain values a function's closure holds (a loss made by a
    factory, `make_loss(0.7)`): two closures of one factory are different
    functions."""
    cells = getattr(value, "__closure__", None) or ()
    return tuple(watched_value(cell_value(cell)) for cell in cells)


def _first_line(value) -> int:
    """Where a function (or a Function class's forward) begins."""
    function = value if isinstance(value, types.FunctionType) else getattr(value, "forward", None)
    return getattr(getattr(function, "__code__", None), "co_firstlineno", 0)


def _module_settings(module: nn.Module) -> tuple:
    """A module's kind, plain attributes and modes, its submodules' too (a
    loss module outside the model: `label_smoothing`, `reduction`; an
    MSELoss swapped for an L1Loss)."""
    return (type(module).__qualname__,) + tuple(
        (path, name, watched) for path, inner in module.named_modules()
        for name, value in vars(inner).items()
        if (name == "training" or name not in MODULE_INTERNALS) and (watched := watched_value(value)) is not UNWATCHED)


# The value of a global or closure variable a loss function read, once it is gone.
_ABSENT_NAME = "<no longer defined>"


def cell_value(cell) -> object:
    try:
        return cell.cell_contents
    except ValueError:  # deleted since
        return _ABSENT_NAME


def say_outside_assignments(loss_fn: Callable, model: nn.Module) -> None:
    """Warns where the loss function or a forward of the user's assigns a
    global, a closure variable or an attribute of its first argument (a
    counter, a cache of the last attention map): the compiled step runs
    that Python once, when it is compiled, not in every call."""
    assignments: list[str] = []
    for _ in free_variables(loss_fn, model, assignments):
        pass
    if assignments:
        warnings.warn(f"fsdpc: {assignments[0]}{f' (and {len(assignments) - 1} more)' if len(assignments) > 1 else ''}"
                      ": the compiled step runs this Python once, when it is compiled, not in every call, so what it "
                      "assigns stays as capture left it (count or keep such things outside loss_fn, or return them "
                      "as aux)", stacklevel=user_stacklevel())
