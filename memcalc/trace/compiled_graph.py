"""How Inductor's generated code allocates a partitioned graph, run op by op on the trace's
fake tensors (``graph_runner``): pointwise ops fused into their consumers, in-place writes
into dying buffers, every value freed after its last use, and the copies its layout
optimisation makes of a convolution's graph inputs.

Known limitations: Inductor's scheduler and memory planner beyond these rules (buffer reuse
across unrelated kernels, reordering) are not read.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import Interpreter

from memcalc.trace._torch_internals import (
    dispatch_modes_paused, inductor_layout_optimization, is_convolution_op, is_pointwise_op,
    is_reduction_op, is_view_op, out_variant)

_CHANNELS_LAST = {4: torch.channels_last}
"""The layout Inductor gives a convolution's inputs, by their dimensions: 2D ones only
(``torch/_inductor/kernel/conv.py``: ``layout_opt and ndim == 2``)."""


def graph_runner(cuda: bool) -> Callable:
    """What runs each partitioned graph for a CUDA target or a CPU one: op by op, every
    value freed after its last use and the input list cleared (``Interpreter.boxed_run``),
    as compiled code holds no value longer."""
    def runner(graph_module):
        layout_copies = inductor_layout_optimization(graph_module, cuda=cuda)

        def run(inputs: list):
            return _FusingInterpreter(graph_module, layout_copies).boxed_run(inputs)
        return run
    return runner


class _FusingInterpreter(Interpreter):
    """Runs a graph as Inductor's code would allocate it: a pointwise op whose every user is
    pointwise or a reduction is fused into them (its value is never a buffer), so it runs
    unseen by the trace's watcher; a pointwise op whose first input is a buffer of its own
    shape and dtype that dies there writes into that buffer (its ``out=`` variant:
    Inductor's in-place kernels); every other value is a buffer, freed after its last use.
    With ``layout_copies`` (Inductor's layout optimisation, channels-last convolutions), a
    graph input a 2D convolution takes (the batch, a weight) is first copied, and the copy is
    what the graph uses and saves for backward (same bytes; the layout itself is left)."""

    def __init__(self, graph_module, layout_copies: bool = False) -> None:
        super().__init__(graph_module, garbage_collect_values=True)
        self.fused = {node for node in graph_module.graph.nodes
                      if _pointwise(node) and node.users and all(map(_fuses, node.users))}
        self.layout_copies = layout_copies
        self._copied: set = set()

    def boxed_run(self, inputs: list):
        """``Interpreter.boxed_run`` without its progress bar (a tqdm bar, even disabled,
        starts a monitor thread that outlives the call): the inputs list cleared, every
        value dropped after its last use."""
        placeholders = [node for node in self.graph.nodes if node.op == "placeholder"]
        self.env = dict(zip(placeholders, inputs))
        inputs.clear()
        for node in self.graph.nodes:
            if node not in self.env:
                self.env[node] = self.run_node(node)
            for dead in self.user_to_last_uses.get(node, ()):
                del self.env[dead]
            if node.op == "output":
                return self.env[node]
        return None

    def run_node(self, node):
        if self.layout_copies and is_convolution_op(node.target):
            self._copy_inputs(node)
        if node in self.fused:
            with dispatch_modes_paused():
                return super().run_node(node)
        if self._writes_in_place(node):
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            op, out = out_variant(node.target)
            return op(*args, **kwargs, **{out: args[0]})
        return super().run_node(node)

    def _copy_inputs(self, node) -> None:
        for arg in node.args[:2]:
            if getattr(arg, "op", None) != "placeholder" or arg in self._copied:
                continue
            self._copied.add(arg)
            value = self.env[arg]
            layout = _CHANNELS_LAST.get(value.dim())
            if layout is not None and not value.is_contiguous(memory_format=layout):
                self.env[arg] = value.clone()     # a new buffer of its bytes, in its place

    def _writes_in_place(self, node) -> bool:
        """The op can write into its first input's buffer: a value of the op's shape, strides
        and dtype (or a view of one) used by nothing else, made by the graph, not saved (a
        value of other strides would hand later views a layout the graph does not have)."""
        if not _pointwise(node) or out_variant(node.target) is None or not node.args:
            return False
        source = base = node.args[0]
        while _single_use(base) and is_view_op(base.target):
            base = base.args[0]
        if not _single_use(base) or source not in self.user_to_last_uses.get(node, ()):
            return False
        value, made = source.meta.get("val"), node.meta.get("val")
        return (isinstance(value, torch.Tensor) and isinstance(made, torch.Tensor)
                and value.shape == made.shape and value.dtype == made.dtype
                and value.stride() == made.stride())


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
