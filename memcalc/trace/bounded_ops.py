"""Data-dependent ops traced with bounded sizes.

Fake tensors carry shapes but no values, so an op whose output size depends on the values
(``nonzero``, ``masked_select``, ``unique``, boolean-mask indexing, torchvision's ``nms``) or
that hands a value to Python (``.item()``, ``bool(tensor)``, ``torch.equal``) cannot run on
them. Each such op has one registered rule: a pure function of the op's arguments that makes
its output at an upper bound of its size (``nonzero``: every element non-zero; ``nms``: every
box kept), or, for a value, one by ``python_values``' rules.

A rule runs only where torch's fake kernel cannot answer (small constant tensors still get
exact answers), and every use is counted: the report lists each op, the bound it got and how
often. Rules take ``bounds`` (``value_counts.ValueCounts``): at most how many elements of a
tensor are non-zero and how many distinct values it holds — its numel, or less for a mask
written at k indices into zeros or a tensor filled with few values. Adding an op is one
``@register_bounded`` function.

Known limitations: an upper bound is not the typical size — a detector's positive proposals
count as every sampled proposal, so its mask and keypoint heads are traced on more boxes than
a real step gives them.
Ops with no bound in their input sizes (``bincount``, ``repeat_interleave`` without
``output_size``) still fail. Values handed to Python follow rules, not the data: a model
whose branches depend on real values traces one branch (the report's head says when a
default value was read).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from memcalc.trace._torch_internals import (
    DATA_DEPENDENT_FAILURES,
    FAKE_KERNELS,
    OpInterceptor,
)
from memcalc.trace.python_values import SCALAR_OP, PythonValues, keeps_most_work
from memcalc.trace.value_counts import ValueCounts

MASK_DTYPES = (torch.bool, torch.uint8)


@dataclass(frozen=True)
class BoundedRule:
    """How one data-dependent op is traced: ``make(bounds, *args, **kwargs)`` returns its
    outputs (made in the active fake mode) at the bound ``bound`` describes."""

    op: str
    """The op's name as ``OpOverload.name()`` gives it (``aten::nonzero``, ``torchvision::nms``)."""
    bound: str
    make: Callable


@dataclass(frozen=True)
class BoundedUse:
    """A bounded op used in a trace: its name, the bound or value it got, how many times."""

    op: str
    bound: str
    count: int
    keeps_most_work: bool = True
    """The bound or value keeps at least the work a real step does (False: a default value
    handed to Python, which may skip some, ``python_values.SCALAR_DEFAULTS``)."""


_RULES: dict[str, BoundedRule] = {}


def register_bounded(op: str, bound: str):
    """Register ``make(bounds, *args, **kwargs)`` as the bounded form of ``op``; once per op.
    ``bounds.nonzero(tensor)`` / ``bounds.distinct(tensor)``: at most how many of the tensor's
    elements are non-zero / distinct (``value_counts.ValueCounts``)."""

    def register(make: Callable) -> Callable:
        if op in _RULES:
            raise ValueError(f"a bounded rule for {op!r} is registered already")
        _RULES[op] = BoundedRule(op, bound, make)
        return make

    return register


def bounded_rule(op: str) -> BoundedRule | None:
    """The rule registered for ``op`` (``aten::nonzero``...), None when there is none."""
    return _RULES.get(op)


def bounded_op_names() -> list[str]:
    return list(_RULES)


# -- sizes ------------------------------------------------------------------------------------

_EVERY_ELEMENT = ("numel of the mask (every element non-zero), or the k indices written into "
                  "a mask of zeros")


@register_bounded("aten::nonzero", f"rows = {_EVERY_ELEMENT}")
def _every_element_nonzero(bounds: ValueCounts, tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty((bounds.nonzero(tensor), tensor.dim()), dtype=torch.int64,
                       device=tensor.device)


@register_bounded("aten::masked_select", f"length = {_EVERY_ELEMENT}, broadcast")
def _every_element_selected(bounds: ValueCounts, tensor: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(tensor.shape, mask.shape)
    numel = bounds.nonzero(mask) * (shape.numel() // max(mask.numel(), 1))
    return torch.empty((numel,), dtype=tensor.dtype, device=tensor.device)


def _unique_outputs(bounds: ValueCounts, tensor: torch.Tensor, return_inverse: bool,
                    return_counts: bool, dim: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As many uniques as distinct values (elements, or slices along ``dim``)."""
    length = bounds.distinct(tensor) if dim is None else tensor.size(dim)
    shape = (length,) if dim is None else (*tensor.shape[:dim], length, *tensor.shape[dim + 1:])
    inverse_shape = tensor.shape if dim is None else (length,)
    device = tensor.device
    return (torch.empty(shape, dtype=tensor.dtype, device=device),
            torch.empty(inverse_shape if return_inverse else (0,), dtype=torch.int64, device=device),
            torch.empty((length,) if return_counts else (0,), dtype=torch.int64, device=device))


_UNIQUE = ("length = numel of the input (every value distinct), or the values a tensor "
           "filled with few values can hold")


@register_bounded("aten::_unique2", _UNIQUE)
def _unique2(bounds, tensor, sorted=True, return_inverse=False, return_counts=False):
    return _unique_outputs(bounds, tensor, return_inverse, return_counts)


@register_bounded("aten::_unique", _UNIQUE)
def _unique(bounds, tensor, sorted=True, return_inverse=False):
    return _unique_outputs(bounds, tensor, return_inverse, False)[:2]


@register_bounded("aten::unique_consecutive", _UNIQUE)
def _unique_consecutive(bounds, tensor, return_inverse=False, return_counts=False,
                        dim=None):
    return _unique_outputs(bounds, tensor, return_inverse, return_counts,
                           None if dim is None else dim % max(tensor.dim(), 1))


@register_bounded("aten::unique_dim", "length = size of the dim (every slice distinct)")
def _unique_dim(bounds, tensor, dim, sorted=True, return_inverse=False,
                return_counts=False):
    return _unique_outputs(bounds, tensor, return_inverse, return_counts, dim % max(tensor.dim(), 1))


@register_bounded("torchvision::nms", "kept = every box in (nothing suppressed)")
def _every_box_kept(bounds: ValueCounts, boxes: torch.Tensor, scores: torch.Tensor,
                    iou_threshold: float) -> torch.Tensor:
    return torch.empty((boxes.size(0),), dtype=torch.int64, device=boxes.device)


def _mask_as_indices(bounds: ValueCounts, indices) -> list:
    """Boolean masks replaced by the index tensors ``nonzero`` gives at its bound, as ATen's
    ``expandTensors`` does (one int64 (numel, dims) tensor, one column per masked dim)."""
    expanded = []
    for index in indices:
        if index is not None and index.dtype in MASK_DTYPES:
            expanded.extend(_every_element_nonzero(bounds, index).unbind(1))
        else:
            expanded.append(index)
    return expanded


@register_bounded("aten::index.Tensor", f"selected = {_EVERY_ELEMENT}")
def _index_by_mask(bounds: ValueCounts, tensor: torch.Tensor, indices) -> torch.Tensor:
    """Reading by a mask (``x[mask]``); writing by one (``index_put``, also its backward)
    needs no bound: its output is the input's size."""
    return torch.ops.aten.index.Tensor(tensor, _mask_as_indices(bounds, indices))


# -- values handed to Python ------------------------------------------------------------------

@register_bounded("aten::equal", "True (the tensors are taken as equal)")
def _equal(bounds, tensor, other) -> bool:
    return True


@register_bounded("aten::allclose", "True (the tensors are taken as close)")
def _allclose(bounds, tensor, other, rtol=1e-5, atol=1e-8, equal_nan=False) -> bool:
    return True


class BoundedOps:
    """The mode that runs the registered rules in a trace (enter it inside the fake mode,
    below the storage watcher, so the watcher records what the rules make) and counts them.

    It also runs ``FAKE_KERNELS`` (memcalc's own shape rules for ops whose fake kernel is too
    narrow, such as ``torch._grouped_mm`` at fp32), which are exact and not counted.
    """

    def __init__(self) -> None:
        self._mode = OpInterceptor(self._handle)
        self._uses: Counter[tuple[str, str]] = Counter()
        self.values = PythonValues()
        self._counts = ValueCounts()

    def __enter__(self) -> BoundedOps:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    def uses(self) -> tuple[BoundedUse, ...]:
        """Every bounded op used so far, with its bound and count, in first-use order."""
        return tuple(BoundedUse(op, bound, count, keeps_most_work(bound))
                     for (op, bound), count in self._uses.items())

    @property
    def use_counts(self) -> Counter[tuple[str, str]]:
        """The live count of each (op, bound) used (``uses`` reads it)."""
        return self._uses

    def forget_values(self, tensors: list[torch.Tensor]) -> None:
        """``tensors`` were written outside the ops seen (a replayed optimizer step)."""
        self._counts.forget(tensors)
        self.values.forget(tensors)

    def _handle(self, func, args, kwargs):
        name = func.name()
        kernel = FAKE_KERNELS.get(name)
        if kernel is not None:
            return kernel(*args, **kwargs)
        try:
            outputs = func(*args, **kwargs)
        except DATA_DEPENDENT_FAILURES:
            if name == SCALAR_OP:               # the one op whose rule needs the trace's memory
                return self._scalar(args[0])
            rule = _RULES.get(name)
            if rule is None:
                raise
            self._uses[(name, rule.bound)] += 1
            outputs = rule.make(self._counts, *args, **kwargs)
        self._counts.observe(func, name, args, kwargs, outputs)
        self.values.observe(func, name, args, kwargs, outputs)
        return outputs

    def _scalar(self, tensor: torch.Tensor) -> object:
        value, meaning = self.values.read(tensor)
        self._uses[(SCALAR_OP, meaning)] += 1
        return value
