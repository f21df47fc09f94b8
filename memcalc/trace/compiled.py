"""Models compiled with ``torch.compile`` (the whole model, blocks one by one as torchtitan
does, or ``Module.compile()`` in place): recognised and made eager again for the trace
(``eager_model``); with ``--compile`` the step runs the model as a ``CompiledRegion``, the
graphs AOTAutograd captures and partitions, so the activations saved for backward are the
compiled step's."""

from __future__ import annotations

import torch
from torch import nn
from torch.fx import Interpreter

from memcalc.errors import first_line
from memcalc.model.build import built_for_real, mark_built_for_real, mark_compiled
from memcalc.model.source import meta_twin
from memcalc.trace._torch_internals import (
    aot_joint_capture, compiled_module_names, dispatch_modes_paused, fake_stand_in,
    is_pointwise_op, is_reduction_op, is_view_op, out_variant, tree_flatten, tree_unflatten,
    without_compile)


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
    """``module`` as ``torch.compile`` runs it in training: at its first call (under the
    step's grad mode and autocast) AOTAutograd captures the joint graph on the fake inputs,
    with the trace's watcher paused, and the partitioner splits it; every call then runs
    the forward graph, whose saved tensors the backward graph consumes, each graph run as
    ``_FusingInterpreter`` allocates it. A module that cannot be captured whole (a graph
    break) runs eagerly: ``fallback`` says why."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.fallback: str | None = None
        self._compiled = None
        self._flat: _FlatCall | None = None

    def forward(self, *args, **kwargs):
        if self.fallback is not None:
            return self.module(*args, **kwargs)
        leaves, structure = tree_flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        if self._compiled is None:
            self._flat = _FlatCall(self.module, leaves, structure)
            try:
                with dispatch_modes_paused():   # examples of their own: the capture keeps them
                    examples = [fake_stand_in(tensor) for tensor in tensors]
                    self._compiled = aot_joint_capture(self._flat, examples, _graph_runner)
            except Exception as error:   # whatever the capture meets: the eager step stands
                self.fallback = f"{type(error).__name__}: {first_line(error)}"
                return self.module(*args, **kwargs)
        return tree_unflatten(list(self._compiled(*tensors)), self._flat.out_structure)


_TENSOR = object()
"""Where a tensor argument goes in a ``_FlatCall``'s arguments."""


class _FlatCall(nn.Module):
    """The module called on its tensor arguments alone (the others fixed as first seen),
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


def _graph_runner(graph_module):
    """A partitioned graph run op by op, every value freed after its last use and the input
    list cleared (``Interpreter.boxed_run``), as compiled code holds no value longer."""
    def run(inputs: list):
        return _FusingInterpreter(graph_module).boxed_run(inputs)
    return run


class _FusingInterpreter(Interpreter):
    """Runs a graph as Inductor's code would allocate it: a pointwise op whose every user is
    pointwise or a reduction is fused into them (its value is never a buffer), so it runs
    unseen by the trace's watcher; a pointwise op whose first input is a buffer of its own
    shape and dtype that dies there writes into that buffer (its ``out=`` variant:
    Inductor's in-place kernels); every other value is a buffer, freed after its last use."""

    def __init__(self, graph_module) -> None:
        super().__init__(graph_module, garbage_collect_values=True)
        self.fused = {node for node in graph_module.graph.nodes
                      if _pointwise(node) and node.users and all(map(_fuses, node.users))}

    def run_node(self, node):
        if node in self.fused:
            with dispatch_modes_paused():
                return super().run_node(node)
        if self._writes_in_place(node):
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            op, out = out_variant(node.target)
            return op(*args, **kwargs, **{out: args[0]})
        return super().run_node(node)

    def _writes_in_place(self, node) -> bool:
        """The op can write into its first input's buffer: a value of the op's shape and
        dtype (or a view of one) used by nothing else, made by the graph, not saved."""
        if not _pointwise(node) or out_variant(node.target) is None or not node.args:
            return False
        source = base = node.args[0]
        while _single_use(base) and is_view_op(base.target):
            base = base.args[0]
        if not _single_use(base) or source not in self.user_to_last_uses.get(node, ()):
            return False
        value, made = source.meta.get("val"), node.meta.get("val")
        return (isinstance(value, torch.Tensor) and isinstance(made, torch.Tensor)
                and value.shape == made.shape and value.dtype == made.dtype)


def _single_use(value) -> bool:
    return (getattr(value, "op", None) == "call_function" and len(value.users) == 1
            and not isinstance(value.target, type(len)))    # getitem: part of a tuple


def _pointwise(node) -> bool:
    return node.op == "call_function" and is_pointwise_op(node.target)


def _fuses(node) -> bool:
    """A consumer Inductor fuses its pointwise producers into: a pointwise op, a reduction,
    or a view that only such consumers read."""
    if node.op != "call_function":
        return False
    if is_pointwise_op(node.target) or is_reduction_op(node.target):
        return True
    return is_view_op(node.target) and bool(node.users) and all(map(_fuses, node.users))


def compiled_regions(model: nn.Module, names: tuple[str, ...]
                     ) -> tuple[nn.Module, dict[str, CompiledRegion]]:
    """``model`` with the modules ``names`` (``""``: the model itself) run compiled."""
    regions: dict[str, CompiledRegion] = {}
    for name in sorted(names, key=len, reverse=True):      # inner ones first
        if not name:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        regions[name] = CompiledRegion(getattr(parent, child))
        setattr(parent, child, regions[name])
    if "" in names:
        model = regions[""] = CompiledRegion(model)
    return model, regions


def fallbacks(regions: dict[str, CompiledRegion]) -> tuple[str, ...]:
    """``name: reason`` for every region that ran eagerly."""
    return tuple(f"{name or '(model)'}: {region.fallback}"
                 for name, region in regions.items() if region.fallback)
