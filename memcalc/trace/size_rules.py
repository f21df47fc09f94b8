"""Storages whose bytes a rule gives: a trace notes the rule beside the storage's record, so
the line through two traces (``memcalc.trace.affine_trace``) recomputes those bytes at another
batch, where the rule (capped, rounded, a minimum of two counts) is not affine in the batch
as the tensors it is computed from are.

The rule is any frozen value with an ``nbytes`` property whose fields are numbers, strings
and tuples of them (the line blends its fields, then asks it for its bytes). Code that makes
such a storage calls ``sized_by(tensor, rule)``; nothing listens outside a trace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

import torch


class SizeRule(Protocol):
    @property
    def nbytes(self) -> int: ...


_LISTENER: ContextVar[Callable[[torch.Tensor, SizeRule], None] | None] = ContextVar(
    "memcalc_size_rules", default=None)


def sized_by(tensor: torch.Tensor, rule: SizeRule) -> None:
    """Note that ``tensor``'s storage holds ``rule.nbytes`` bytes by ``rule``."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(tensor, rule)


@contextmanager
def noting(listener: Callable[[torch.Tensor, SizeRule], None]) -> Iterator[None]:
    """``listener`` hears every ``sized_by`` in this context until it exits."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)
