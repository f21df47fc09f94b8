"""Upper bounds on how many elements of a tensor can be non-zero, carried from op to op.

``nonzero`` of a mask is bounded by the mask's numel, but a mask made of zeros and then set
at k indices has at most k non-zero elements. Detectors build their sampled proposals that way
(torchvision's ``BalancedPositiveNegativeSampler`` writes 128 positive and 384 negative
indices into zero masks of ~2,000 proposals, then takes ``nonzero`` of their union), so with
these counts the heads are traced on 512 proposals per image instead of every proposal.

Counts are kept per storage. Each registered rule says how an op's output count follows from
its inputs' counts; any other write into a counted storage (a view's included) forgets the
count, so a count is always a true upper bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from memcalc.trace._torch_internals import WeakIdKeyDictionary, written_tensors

CountOf = Callable[[torch.Tensor], "int | None"]
"""The known bound on a tensor's non-zero elements, None when there is none."""

_RULES: dict[str, Callable] = {}


def count_rule(*ops: str):
    """Register ``rule(count_of, *args, **kwargs) -> int | None`` for ``ops`` (by name)."""

    def register(rule: Callable) -> Callable:
        for op in ops:
            if op in _RULES:
                raise ValueError(f"a count rule for {op!r} is registered already")
            _RULES[op] = rule
        return rule

    return register


@count_rule("aten::zeros", "aten::zeros_like", "aten::new_zeros")
def _zeros(count_of: CountOf, *args, **kwargs) -> int:
    return 0


@count_rule("aten::full", "aten::full_like", "aten::new_full")
def _filled(count_of: CountOf, *args, **kwargs) -> int | None:
    fill = args[1] if len(args) > 1 else kwargs.get("fill_value")
    return 0 if isinstance(fill, (bool, int, float)) and fill == 0 else None


@count_rule("aten::index_put_", "aten::_index_put_impl_", "aten::index_put")
def _written_at_indices(count_of: CountOf, tensor, indices, values, *args, **kwargs
                        ) -> int | None:
    """Writing at integer indices sets at most as many elements as the indices address."""
    before = count_of(tensor)
    if before is None or any(index is None or not _integral(index) for index in indices):
        return None
    addressed = torch.broadcast_shapes(*(index.shape for index in indices)).numel()
    return before + addressed * math.prod(tensor.shape[len(indices):])


@count_rule("aten::bitwise_or.Tensor", "aten::logical_or", "aten::cat")
def _union(count_of: CountOf, *args, **kwargs) -> int | None:
    tensors = list(args[0]) if isinstance(args[0], (list, tuple)) else list(args[:2])
    counts = [count_of(tensor) for tensor in tensors]
    return None if None in counts else sum(counts)


@count_rule("aten::bitwise_and.Tensor", "aten::logical_and")
def _intersection(count_of: CountOf, first, second) -> int | None:
    counts = [count for count in (count_of(first), count_of(second)) if count is not None]
    return min(counts) if counts else None


@count_rule("aten::_to_copy", "aten::clone", "aten::ne.Scalar", "aten::gt.Scalar",
            "aten::abs", "aten::neg")
def _same_zeros(count_of: CountOf, tensor, *args, **kwargs) -> int | None:
    """Ops that keep zeros zero (``ne``/``gt`` only against a zero scalar)."""
    if args and not (isinstance(args[0], (bool, int, float)) and args[0] == 0):
        return None
    return count_of(tensor)


def _integral(index: torch.Tensor) -> bool:
    return not index.is_floating_point() and index.dtype not in (torch.bool, torch.uint8)


class MaskCounts:
    """The counts of one trace: ``observe`` every op after it ran, ``bound`` a tensor."""

    def __init__(self) -> None:
        self._counts: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def bound(self, tensor: torch.Tensor) -> int:
        """At most this many elements of ``tensor`` are non-zero (its numel when unknown)."""
        count = self._counts.get(tensor.untyped_storage())
        return tensor.numel() if count is None else min(count, tensor.numel())

    def observe(self, func, name: str, args, kwargs, outputs) -> None:
        rule = _RULES.get(name)
        count = rule(self._count_of, *args, **kwargs) if rule is not None else None
        if self._counts:
            for tensor in written_tensors(func, args, kwargs):
                self._counts.pop(tensor.untyped_storage(), None)
        if count is not None and isinstance(outputs, torch.Tensor):
            self._counts[outputs.untyped_storage()] = min(count, outputs.numel())

    def _count_of(self, tensor) -> int | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        return self._counts.get(tensor.untyped_storage())
