"""Wrap units: which modules form FSDP communication groups.

FSDP2's rule, applied bottom-up: each wrap unit owns the parameters under it
that no nested unit owns; the root owns the rest. A parameter registered
under several names (tied) that fall into different units belongs to the
root, the only unit that contains all of its uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Union

from torch import nn

WrapPolicy = Union[None, Iterable[str], Callable[[str, nn.Module], bool]]

ROOT_UNIT = "root"


@dataclass
class Unit:
    name: str          # module FQN, or ROOT_UNIT for the root
    module_class: str
    is_root: bool = False


@dataclass
class UnitPlan:
    units: list[Unit]  # the root first, then module order

    def owner(self, fqns: list[str]) -> str:
        """The unit owning a parameter registered under `fqns`."""
        owners = {self._innermost(fqn) for fqn in fqns}
        return owners.pop() if len(owners) == 1 else ROOT_UNIT

    def _innermost(self, fqn: str) -> str:
        containing = [u.name for u in self.units if not u.is_root and fqn.startswith(u.name + ".")]
        return max(containing, key=len, default=ROOT_UNIT)


def default_wrapped(model: nn.Module) -> list[str]:
    """Each block of the model's largest stack of identical blocks (the
    transformer layers); failing that, each direct child with parameters."""
    best, best_size = None, 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            classes = {type(child) for child in module}
            size = sum(p.numel() for p in module.parameters())
            if len(classes) == 1 and size > best_size:
                best, best_size = name, size
    if best is not None:
        prefix = best + "." if best else ""
        return [prefix + child for child, _ in model.get_submodule(best).named_children()]
    return [name for name, child in model.named_children() if any(True for _ in child.parameters())]


def plan_units(model: nn.Module, wrap: WrapPolicy = None) -> UnitPlan:
    """Units for `model`: the default policy, module class names, or a
    predicate `wrap(fqn, module) -> bool`."""
    if wrap is None:
        chosen = set(default_wrapped(model))
        wanted = lambda name, module: name in chosen  # noqa: E731
    elif callable(wrap):
        wanted = wrap
    else:
        class_names = set(wrap)
        known = {type(m).__name__ for m in model.modules()}
        unknown = class_names - known
        if unknown:
            raise ValueError(
                f"wrap classes {sorted(unknown)} do not occur in {type(model).__name__} "
                f"(its module classes: {', '.join(sorted(known))})")
        wanted = lambda name, module: type(module).__name__ in class_names  # noqa: E731
    units = [Unit(ROOT_UNIT, type(model).__name__, is_root=True)]
    for name, module in model.named_modules():
        if name and wanted(name, module):
            if name == ROOT_UNIT:
                raise ValueError(f"a wrapped module may not be named '{ROOT_UNIT}'")
            units.append(Unit(name, type(module).__name__))
    return UnitPlan(units)
