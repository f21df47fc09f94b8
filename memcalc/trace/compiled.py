"""Models compiled with ``torch.compile`` (the whole model, blocks one by one as torchtitan
does, or ``Module.compile()`` in place): recognised and made eager again for the trace
(``eager_model``); with ``--compile`` the step runs the model as a ``CompiledRegion``, the
graphs AOTAutograd captures and partitions, so the activations saved for backward are the
compiled step's."""

from __future__ import annotations

import functools

import torch
from torch import nn

from memcalc.errors import first_line
from memcalc.model.build import built_for_real, mark_built_for_real, mark_compiled
from memcalc.model.source import meta_twin
from memcalc.trace._torch_internals import (
    aot_joint_capture, compiled_module_names, dispatch_modes_paused, fake_stand_in,
    tree_flatten, tree_unflatten, without_compile)
from memcalc.trace.compiled_graph import graph_runner


def eager_model(model: nn.Module, original: nn.Module | None = None) -> nn.Module:
    """``model`` itself when nothing in it (or in the ``original`` it was copied from) is
    compiled; else an eager meta twin (the caller's model untouched), marked with the names
    of the modules that were compiled."""
    names = compiled_module_names(original if original is not None else model)
    if not names:
        return model
    twin = without_compile(meta_twin(model))
    mark_compiled(twin, names)
    if built_for_real(model):
        mark_built_for_real(twin)
    return twin


class CompiledRegion(nn.Module):
    """``module`` as ``torch.compile`` runs it in training: at its first call of each kind
    (under the step's grad mode and autocast) AOTAutograd captures the joint graph on the
    fake inputs, with the trace's watcher paused, and the partitioner splits it; every call
    then runs the forward graph, whose saved tensors the backward graph consumes, each
    graph run as ``memcalc.trace.compiled_graph`` allocates it. A module that cannot be
    captured whole (a graph break: data-dependent Python, arguments or outputs that are
    not tensors or constants) runs eagerly, ``fallback`` saying why, with its submodules
    compiled each on its own (``parts``): Dynamo splits the graph at the break and compiles
    what is around it; here the split is at module boundaries. Attributes other than its
    own are the module's, as on an ``OptimizedModule``."""

    def __init__(self, module: nn.Module, cuda: bool = False) -> None:
        super().__init__()
        self.module, self.cuda = module, cuda
        self.fallback: str | None = None
        self.parts: dict[str, CompiledRegion] = {}
        self._entries: dict[tuple, tuple] = {}
        # the module's signature, for code that reads it (Hugging Face's input checks)
        self.forward = functools.wraps(module.forward)(
            lambda *args, **kwargs: self._forward(*args, **kwargs))

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("module"), name)

    def _forward(self, *args, **kwargs):
        if self.fallback is not None:
            return self.module(*args, **kwargs)
        leaves, structure = tree_flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        key = _call_key(leaves, structure)
        if key not in self._entries:
            try:
                self._entries[key] = self._capture(leaves, structure, tensors)
            except Exception as error:   # whatever the capture meets: the eager step stands
                self.fallback = f"{type(error).__name__}: {first_line(error)}"
                self.parts = _compiled_children(self.module, self.cuda)
                return self.module(*args, **kwargs)
        compiled, flat = self._entries[key]
        return tree_unflatten(list(compiled(*tensors)), flat.out_structure)

    def _capture(self, leaves: list, structure, tensors: list):
        """The graphs of one kind of call (its tensors' shapes, its other arguments), as
        Dynamo compiles each kind once, up to its recompile limit."""
        if len(self._entries) >= RECOMPILE_LIMIT:
            raise RuntimeError(f"called {RECOMPILE_LIMIT} ways (Dynamo's recompile_limit)")
        others = [leaf for leaf in leaves
                  if not isinstance(leaf, (torch.Tensor, *_CONSTANTS))]
        if others:   # captured as fixed values, it would keep capture-time tensors in them
            raise TypeError(f"an argument of type {type(others[0]).__name__} is not a "
                            "constant (Dynamo traces into it; memcalc does not)")
        flat = _FlatCall(self.module, leaves, structure)
        with dispatch_modes_paused():   # examples of their own: the capture keeps them
            examples = [fake_stand_in(tensor) for tensor in tensors]
            return aot_joint_capture(flat, examples, graph_runner(self.cuda)), flat


RECOMPILE_LIMIT = 8
"""Kinds of call Dynamo compiles a frame for before it runs it eagerly
(``torch._dynamo.config.recompile_limit``)."""
_CONSTANTS = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout,
              torch.memory_format)


def _call_key(leaves: list, structure) -> tuple:
    """What tells one kind of call from another: the arguments' structure, the tensors'
    layout and whether they need gradients, the other values."""
    return (repr(structure), tuple(
        (tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype, leaf.requires_grad)
        if isinstance(leaf, torch.Tensor) else repr(leaf) for leaf in leaves))


_TENSOR = object()
"""Where a tensor argument goes in a ``_FlatCall``'s arguments."""


class _FlatCall(nn.Module):
    """The module called on its tensor arguments alone (the others fixed, constants),
    returning its outputs flattened into a tuple, as AOTAutograd's capture needs."""

    def __init__(self, module: nn.Module, leaves: list, structure) -> None:
        super().__init__()
        self.module, self._structure = module, structure
        # the tensors' places only: holding the first call's tensors would keep them alive
        self._leaves = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        self.out_structure = None

    def forward(self, *tensors):
        given = iter(tensors)
        leaves = [next(given) if leaf is _TENSOR else leaf for leaf in self._leaves]
        args, kwargs = tree_unflatten(leaves, self._structure)
        outputs, self.out_structure = tree_flatten(self.module(*args, **kwargs))
        return tuple(outputs)


def compiled_regions(model: nn.Module, names: tuple[str, ...], cuda: bool = False
                     ) -> tuple[nn.Module, dict[str, CompiledRegion]]:
    """``model`` with the modules ``names`` (``""``: the model itself) run compiled, as
    Inductor compiles for a CUDA GPU (``cuda``) or a CPU."""
    regions: dict[str, CompiledRegion] = {}
    for name in sorted(names, key=len, reverse=True):      # inner ones first
        if not name:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        regions[name] = CompiledRegion(getattr(parent, child), cuda)
        setattr(parent, child, regions[name])
    if "" in names:
        model = regions[""] = CompiledRegion(model, cuda)
    return model, regions


def _compiled_children(module: nn.Module, cuda: bool, prefix: str = ""
                       ) -> dict[str, CompiledRegion]:
    """``module``'s children, each replaced by a ``CompiledRegion`` of its own (the elements
    of a ``ModuleList`` or ``ModuleDict``, which are not called themselves)."""
    parts: dict[str, CompiledRegion] = {}
    for name, child in list(module.named_children()):
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            parts.update(_compiled_children(child, cuda, f"{prefix}{name}."))
        else:
            parts[prefix + name] = CompiledRegion(child, cuda)
            setattr(module, name, parts[prefix + name])
    return parts


def fallbacks(regions: dict[str, CompiledRegion]) -> tuple[str, ...]:
    """One line per reason a region (or, where its submodules were compiled on their own,
    one of theirs) was not captured whole, naming the regions it held for."""
    grouped: dict[tuple[str, bool], list[tuple[str, int]]] = {}
    for name, region in _eager_regions(regions):
        grouped.setdefault((region.fallback, bool(region.parts)), []).append(
            (name or "(model)", len(region.parts)))
    lines = []
    for (reason, split), names in grouped.items():
        if len(names) == 1:
            (name, parts), = names
            what = (f"its {parts} submodules compiled each on its own, the rest traced eager"
                    if split else "traced eager")
            lines.append(f"{name} not captured whole ({reason}): {what}")
            continue
        listed = ", ".join(name for name, _ in names[:3]) + (", …" if len(names) > 3 else "")
        what = ("their submodules compiled each on its own, the rest traced eager" if split
                else "traced eager")
        lines.append(f"{len(names)} modules not captured whole ({reason}): {listed}; {what}")
    return tuple(lines)


def _eager_regions(regions: dict[str, CompiledRegion]):
    for name, region in regions.items():
        if region.fallback:
            yield name, region
            yield from _eager_regions({f"{name}.{part}" if name else part: sub
                                       for part, sub in region.parts.items()})
