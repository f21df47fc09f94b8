"""The user's own hooks on the model (forward, pre-forward, backward): run by the trace as
the model runs them, with two guards.

- A hook that cannot run on fake tensors (it reads values: ``.numpy()``, ``.item()``) makes
  the trace fail; the step is then traced again on a copy without the user's hooks, and the
  report says so (what such a hook keeps alive is then not counted).
- A hook that keeps what it is given (a list of activations) would keep memcalc's fake or
  meta tensors after the call: the containers a hook can reach (its closure, the object it
  is bound to, the globals it names) are cleared of them once the call is over.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
              "_backward_pre_hooks")


def _hook_tables(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """Each (module, table name) of ``model`` that holds hooks."""
    return [(module, name) for module in model.modules() for name in HOOK_DICTS
            if getattr(module, name, None)]


def user_hooks(model: nn.Module) -> list:
    """Every hook registered on ``model``'s modules."""
    return [hook for module, name in _hook_tables(model)
            for hook in getattr(module, name).values()]


def without_user_hooks(model: nn.Module) -> nn.Module:
    """``model`` (a copy of the user's) with no hooks: each module given empty hook tables
    (new ones: the copy's tables may be shared with the user's model)."""
    for module, name in _hook_tables(model):
        setattr(module, name, collections.OrderedDict())
    return model


@contextlib.contextmanager
def hooks_set_aside(model: nn.Module) -> Iterator[None]:
    """``model`` (memcalc's own build or copy) without hooks inside the block, its hook
    tables put back after."""
    saved = [(module, name, getattr(module, name)) for module, name in _hook_tables(model)]
    without_user_hooks(model)
    try:
        yield
    finally:
        for module, name, table in saved:
            setattr(module, name, table)


def _untraced(value: Any) -> bool:
    """A tensor of memcalc's trace (fake or meta), or a tuple holding one."""
    if isinstance(value, torch.Tensor):
        return type(value).__name__ == "FakeTensor" or value.device.type == "meta"
    return isinstance(value, tuple) and any(_untraced(item) for item in value)


def _reachable(hook: Any) -> Iterator[Any]:
    function = getattr(hook, "__func__", hook)
    bound = getattr(hook, "__self__", None)
    for cell in getattr(function, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:      # an empty cell
            continue
    code, namespace = getattr(function, "__code__", None), getattr(function, "__globals__", {})
    for name in (code.co_names if code is not None else ()):
        if name in namespace:
            yield namespace[name]
    if bound is not None and hasattr(bound, "__dict__"):
        yield from vars(bound).values()


def clear_traced_tensors(model: nn.Module) -> int:
    """Take memcalc's fake and meta tensors out of the containers ``model``'s hooks reach
    (lists, dicts, sets, deques, and those held by a reached object); how many were taken."""
    taken = 0
    for hook in user_hooks(model):
        for value in _reachable(hook):
            for container in (value, *(vars(value).values() if hasattr(value, "__dict__")
                                        and not isinstance(value, type) else ())):
                taken += _clear(container)
    return taken


def _clear(container: Any) -> int:
    if isinstance(container, (list, collections.deque)):
        kept = [item for item in container if not _untraced(item)]
        taken = len(container) - len(kept)
        container.clear()
        container.extend(kept)
        return taken
    if isinstance(container, dict):
        doomed = [key for key, item in container.items() if _untraced(item)]
        for key in doomed:
            del container[key]
        return len(doomed)
    if isinstance(container, set):
        doomed = {item for item in container if _untraced(item)}
        container -= doomed
        return len(doomed)
    return 0
