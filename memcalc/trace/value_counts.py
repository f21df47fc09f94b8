"""Upper bounds on how many elements of a tensor are non-zero, and how many distinct values it
holds, carried from op to op so that data-dependent sizes get tighter bounds than numel.

- Non-zero: a mask made of zeros and then set at k indices has at most k non-zero elements.
  Detectors build their sampled proposals that way (torchvision's
  ``BalancedPositiveNegativeSampler`` writes 128 positive and 384 negative indices into zero
  masks of ~2,000 proposals, then takes ``nonzero`` of their union), so the heads are traced on
  512 proposals per image instead of every proposal.
- Distinct: a tensor filled with one value and the concatenations and gathers of such tensors
  hold few values. torchvision's ``batched_nms`` loops over ``unique`` of the proposals'
  pyramid levels (5 values), not over every proposal.

Counts are kept per storage. Each registered rule says how an op's output count follows from
its inputs' counts; any other write into a counted storage (a view's included) forgets its
counts, so a count is always a true upper bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from memcalc.trace._torch_internals import WeakIdKeyDictionary, written_tensors

CountOf = Callable[[torch.Tensor], "int | None"]
"""A tensor's known count (of the kind the rule is for), None when there is none."""

NONZERO, DISTINCT = "nonzero", "distinct"
_RULES: dict[str, dict[str, Callable]] = {NONZERO: {}, DISTINCT: {}}


def count_rule(kind: str, *ops: str):
    """Register ``rule(count_of, *args, **kwargs) -> int | None`` for ``ops`` (by name): how
    the output's count of ``kind`` (``NONZERO`` or ``DISTINCT``) follows from the inputs'."""

    def register(rule: Callable) -> Callable:
        for op in ops:
            if op in _RULES[kind]:
                raise ValueError(f"a {kind} count rule for {op!r} is registered already")
            _RULES[kind][op] = rule
        return rule

    return register


def _constant(value: int) -> Callable:
    return lambda count_of, *args, **kwargs: value


count_rule(NONZERO, "aten::zeros", "aten::zeros_like", "aten::new_zeros")(_constant(0))
count_rule(DISTINCT, "aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::ones",
           "aten::ones_like", "aten::new_ones", "aten::full", "aten::full_like",
           "aten::new_full", "aten::scalar_tensor")(_constant(1))


@count_rule(NONZERO, "aten::full", "aten::full_like", "aten::new_full")
def _filled(count_of: CountOf, *args, **kwargs) -> int | None:
    fill = args[1] if len(args) > 1 else kwargs.get("fill_value")
    return 0 if isinstance(fill, (bool, int, float)) and fill == 0 else None


@count_rule(NONZERO, "aten::index_put_", "aten::_index_put_impl_", "aten::index_put")
def _written_at_indices(count_of: CountOf, tensor, indices, values, *args, **kwargs
                        ) -> int | None:
    """Writing at integer indices sets at most as many elements as the indices address."""
    before = count_of(tensor)
    if before is None or any(index is None or not _integral(index) for index in indices):
        return None
    addressed = torch.broadcast_shapes(*(index.shape for index in indices)).numel()
    return before + addressed * math.prod(tensor.shape[len(indices):])


@count_rule(NONZERO, "aten::bitwise_or.Tensor", "aten::logical_or", "aten::cat")
@count_rule(DISTINCT, "aten::cat")
def _union(count_of: CountOf, *args, **kwargs) -> int | None:
    tensors = list(args[0]) if isinstance(args[0], (list, tuple)) else list(args[:2])
    counts = [count_of(tensor) for tensor in tensors]
    return None if None in counts else sum(counts)


@count_rule(NONZERO, "aten::bitwise_and.Tensor", "aten::logical_and")
def _intersection(count_of: CountOf, first, second) -> int | None:
    counts = [count for count in (count_of(first), count_of(second)) if count is not None]
    return min(counts) if counts else None


@count_rule(NONZERO, "aten::_to_copy", "aten::clone", "aten::ne.Scalar", "aten::gt.Scalar",
            "aten::abs", "aten::neg")
def _same_zeros(count_of: CountOf, tensor, *args, **kwargs) -> int | None:
    """Ops that keep zeros zero (``ne``/``gt`` only against a zero scalar)."""
    if args and not (isinstance(args[0], (bool, int, float)) and args[0] == 0):
        return None
    return count_of(tensor)


@count_rule(DISTINCT, "aten::_to_copy", "aten::clone", "aten::index.Tensor",
            "aten::index_select", "aten::gather", "aten::take")
def _subset_of_values(count_of: CountOf, tensor, *args, **kwargs) -> int | None:
    """Copies and gathers hold no value their input does not."""
    return count_of(tensor)


def _integral(index: torch.Tensor) -> bool:
    return not index.is_floating_point() and index.dtype not in (torch.bool, torch.uint8)


class ValueCounts:
    """The counts of one trace: ``observe`` every op after it ran; ``nonzero`` and ``distinct``
    bound a tensor (its numel when nothing is known)."""

    def __init__(self) -> None:
        self._counts = {NONZERO: WeakIdKeyDictionary(), DISTINCT: WeakIdKeyDictionary()}

    def nonzero(self, tensor: torch.Tensor) -> int:
        """At most this many elements of ``tensor`` are non-zero."""
        return self._bound(NONZERO, tensor)

    def distinct(self, tensor: torch.Tensor) -> int:
        """At most this many distinct values are in ``tensor``."""
        return self._bound(DISTINCT, tensor)

    def observe(self, func, name: str, args, kwargs, outputs) -> None:
        found = {kind: _RULES[kind][name](partial(_count_in, counts), *args, **kwargs)
                 for kind, counts in self._counts.items() if name in _RULES[kind]}
        if any(self._counts.values()):
            written = [tensor.untyped_storage() for tensor in written_tensors(func, args, kwargs)]
            for counts in self._counts.values():
                for storage in written:
                    counts.pop(storage, None)
        for kind, count in found.items():
            if count is not None and isinstance(outputs, torch.Tensor):
                self._counts[kind][outputs.untyped_storage()] = min(count, outputs.numel())

    def forget(self, tensors: list[torch.Tensor]) -> None:
        """``tensors`` were written by something not observed: their counts go."""
        for counts in self._counts.values():
            for tensor in tensors:
                counts.pop(tensor.untyped_storage(), None)

    def _bound(self, kind: str, tensor: torch.Tensor) -> int:
        count = self._counts[kind].get(tensor.untyped_storage())
        return tensor.numel() if count is None else min(count, tensor.numel())


def _count_in(counts: WeakIdKeyDictionary, tensor) -> int | None:
    return counts.get(tensor.untyped_storage()) if isinstance(tensor, torch.Tensor) else None
