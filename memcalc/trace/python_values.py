"""Values a traced step hands to Python (``.item()``, ``bool(tensor)``, ``int(tensor)``,
``.tolist()``): fake tensors hold none, so each read gets a value by rule, and the rule says
which side of the truth it puts the estimate on.

In order: an element set to a constant (``flags[i] = 1``, ``fill_`` of one element:
``IN_PLACE_FILLS``) gives that constant, through copies of the whole tensor and the fake
process group's collectives; a tensor memcalc filled itself (a per-sample length input) or
that an op filled with one constant (``torch.ones``, ``torch.full``: ``CONSTANT_FILLS``) gives
the value it was filled with, and so does every reduction or copy of it (``lengths.max()``,
MONAI's ``torch.min(importance_map)`` of a constant map); a draw from a
uniform distribution gives the top of its range, the value that keeps the most work (a
LayerDrop draw above any drop probability keeps its layer; torchvision's random size choice
takes the largest size); a 0-dim result of a check or count gives its passing value
(``SCALAR_CONVENTIONS``); anything else gets a default by dtype (``SCALAR_DEFAULTS``: 0,
0.0, False), which may skip work a real step does (a loop counted by it runs as if 0), and
the report's head says so.

Known limitations: a value computed from a filled tensor by arithmetic (``lengths.sum()``) is
not followed; a draw from a normal distribution gets the default 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from memcalc.trace._torch_internals import WeakIdKeyDictionary, lifted_number, written_tensors

SCALAR_OP = "aten::_local_scalar_dense"
"""What ``.item()``, ``bool(tensor)``, ``int(tensor)`` and ``.tolist()`` run."""


class ScalarValue(NamedTuple):
    value: object
    meaning: str
    """The value and why, in words (the report's bound)."""


SCALAR_DEFAULTS: dict[str, ScalarValue] = {
    "bool": ScalarValue(False, "False (a flag no element raised)"),
    "int": ScalarValue(0, "0 (a valid index, an empty count)"),
    "float": ScalarValue(0.0, "0.0 (a value no rule covers)"),
}
"""``.item()`` of a tensor whose value no rule covers, by the kind of its dtype: the only
values that can leave out work a real step does."""

_TOP_OF_DRAW = ("just below the top of a uniform draw (keeps the most work: a LayerDrop draw "
                "keeps its layer, a random choice takes the last, largest option)")


def _below(top: float, bottom: float) -> float:
    return math.nextafter(float(top), float(bottom))


def _randint_top(*args, **kwargs) -> int:
    high = args[1] if len(args) > 1 and isinstance(args[1], int) else args[0]
    return int(high) - 1


SCALAR_CONVENTIONS: dict[str, tuple[Callable, str]] = {
    "aten::any": (lambda tensor, *args, **kwargs: False, "False: any() of a check (no element "
                  "flagged, e.g. torchvision's degenerate boxes)"),
    "aten::all": (lambda tensor, *args, **kwargs: True, "True: all() of a check (every element "
                  "passes)"),
    "aten::count_nonzero": (lambda tensor, *args, **kwargs: tensor.numel(),
                            "numel: count_nonzero (every element non-zero, as nonzero's bound)"),
    "aten::rand": (lambda *args, **kwargs: _below(1.0, 0.0), _TOP_OF_DRAW),
    "aten::rand_like": (lambda *args, **kwargs: _below(1.0, 0.0), _TOP_OF_DRAW),
    "aten::uniform_": (lambda tensor, low=0.0, high=1.0, *args, **kwargs: _below(high, low),
                       _TOP_OF_DRAW),
    "aten::randint": (_randint_top, "high - 1: the top of a random integer draw (keeps the "
                      "most work)"),
}
"""``.item()`` of a one-element tensor that an op in this table made, by that op's name: the
value (from the op's arguments) and what it means."""

_READS_ELEMENTS = frozenset({
    "aten::max", "aten::min", "aten::amax", "aten::amin", "aten::median", "aten::clone",
    "aten::_to_copy", "aten::select", "aten::slice", "aten::view", "aten::unsqueeze",
    "aten::squeeze", "aten::expand", "aten::alias", "aten::detach", "aten::index_select",
    "aten::reshape", "aten::_unsafe_view", "aten::lift_fresh"})
"""Ops whose output holds only values of their first input: a filled input's value goes on."""


def _filled_with(value) -> Callable:
    return lambda *args, **kwargs: value


def _argument(position: int, name: str) -> Callable:
    return lambda *args, **kwargs: kwargs[name] if name in kwargs else args[position]


CONSTANT_FILLS: dict[str, Callable] = {
    "aten::ones": _filled_with(1), "aten::ones_like": _filled_with(1),
    "aten::new_ones": _filled_with(1), "aten::zeros": _filled_with(0),
    "aten::zeros_like": _filled_with(0), "aten::new_zeros": _filled_with(0),
    "aten::full": _argument(1, "fill_value"), "aten::full_like": _argument(1, "fill_value"),
    "aten::new_full": _argument(2, "fill_value"), "aten::scalar_tensor": _argument(0, "s"),
}
"""Ops whose output holds one constant, the value from their arguments: read back exactly,
as are its reductions and copies (``_READS_ELEMENTS``), until something writes into it."""


IN_PLACE_FILLS: dict[str, Callable] = {
    "aten::fill_": _argument(1, "value"), "aten::zero_": _filled_with(0)}
"""In-place ops that write one constant into their tensor: the whole storage (then as
``CONSTANT_FILLS``), or one element of it (a flag set by indexing: DDP's reducer marks each
parameter used with ``local_used_map_[i] = 1`` and reads the map back under ``static_graph``)."""
_SAME_LAYOUT = frozenset({"aten::clone", "aten::_to_copy", "aten::copy_"})
"""Ops whose output holds the elements of their source at the same positions: the values
known per element go on where both cover their whole storage."""
KEEPS_VALUES = "c10d::"
"""Collectives of torch's fake process group leave their tensors as they were, so known values
stay known (each rank's, as this rank set them: a sum over ranks of flags set on every rank
is read as the flag)."""


def keeps_most_work(meaning: str) -> bool:
    """False for the defaults, the values that may leave out work a real step does."""
    return meaning not in {default.meaning for default in SCALAR_DEFAULTS.values()}


class PythonValues:
    """Values for the reads of one trace: ``fill`` marks a tensor memcalc filled, ``observe``
    follows each op, ``read`` answers a read of a tensor."""

    def __init__(self) -> None:
        self._made: WeakIdKeyDictionary = WeakIdKeyDictionary()   # tensor -> ScalarValue
        self._filled: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> ScalarValue
        self._elements: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # storage -> {element offset: ScalarValue}, over what _filled says of the rest

    def fill(self, tensor: torch.Tensor, value: object, meaning: str) -> None:
        self._filled[tensor.untyped_storage()] = ScalarValue(value, meaning)

    def forget(self, tensors: list[torch.Tensor]) -> None:
        """``tensors`` were written outside the ops seen: their filled values no longer hold."""
        for tensor in tensors:
            self._filled.pop(tensor.untyped_storage(), None)
            self._elements.pop(tensor.untyped_storage(), None)

    def observe(self, func, name: str, args, kwargs, outputs) -> None:
        base = name.partition(".")[0]
        fill = IN_PLACE_FILLS.get(base)
        if fill is not None and args and isinstance(args[0], torch.Tensor):
            self._write(args[0], fill(*args, **kwargs), base.removeprefix("aten::"))
            return
        known_any = bool(self._filled or self._elements)
        if (known_any and base == "aten::copy_" and len(args) > 1
                and isinstance(args[1], torch.Tensor)):
            known = self._known(args[1]) if args[0].numel() == 1 else None
            if known is not None:       # tensor[i] = value, as Python sets an element
                self._write(args[0], known.value, "copy_")
            else:
                self._carry(args[1], args[0])
            return
        if known_any and not name.startswith(KEEPS_VALUES):
            self.forget(written_tensors(func, args, kwargs))
        first = outputs[0] if isinstance(outputs, (tuple, list)) and outputs else outputs
        if not isinstance(first, torch.Tensor):
            return
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (source is not None and base in _SAME_LAYOUT
                and source.untyped_storage() in self._elements and _same_layout(source, first)):
            self._carry(source, first)
            return
        value = lifted_number(first) if base == "aten::lift_fresh" else None
        if value is not None:
            self.fill(first, value, f"{value}: the Python number it was made from")
            return
        filled = self._filled.get(source.untyped_storage()) if source is not None else None
        if filled is not None and base in _READS_ELEMENTS:
            self._filled[first.untyped_storage()] = filled
            return
        constant = CONSTANT_FILLS.get(base)
        if constant is not None:
            value = constant(*args, **kwargs)
            if isinstance(value, (bool, int, float)):
                self.fill(first, value,
                          f"{value}: the constant {base.removeprefix('aten::')} filled it with")
            return
        convention = SCALAR_CONVENTIONS.get(base)
        if convention is not None and first.numel() == 1:
            self._made[first] = ScalarValue(convention[0](*args, **kwargs), convention[1])

    def _write(self, tensor: torch.Tensor, value, op: str) -> None:
        """``tensor`` filled in place with ``value``: all of its storage, one element of it,
        or a part (then nothing of the storage is known)."""
        storage = tensor.untyped_storage()
        if not isinstance(value, (bool, int, float)):
            self.forget([tensor])
        elif _whole(tensor):
            self.forget([tensor])
            self.fill(tensor, value, f"{value}: the constant {op} filled it with")
        elif tensor.numel() == 1:
            elements = self._elements.get(storage) or {}
            elements[tensor.storage_offset()] = ScalarValue(
                value, f"{value}: the element {op} set it to")
            self._elements[storage] = elements
        else:
            self.forget([tensor])

    def _carry(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """``target`` now holds ``source``'s elements: what is known of them goes on where
        both cover their whole storage, else nothing of ``target``'s storage is known."""
        known = (self._filled.get(source.untyped_storage()),
                 self._elements.get(source.untyped_storage()))
        self.forget([target])
        if not _same_layout(source, target):
            return
        if known[0] is not None:
            self._filled[target.untyped_storage()] = known[0]
        if known[1] is not None:
            self._elements[target.untyped_storage()] = dict(known[1])

    def _known(self, tensor: torch.Tensor) -> ScalarValue | None:
        storage = tensor.untyped_storage()
        element = (self._elements.get(storage) or {}).get(tensor.storage_offset())
        return element or self._filled.get(storage) or self._made.get(tensor)

    def read(self, tensor: torch.Tensor) -> ScalarValue:
        kind = _scalar_kind(tensor.dtype)
        found = self._known(tensor)
        if found is None:
            return SCALAR_DEFAULTS[kind]
        return ScalarValue(_CASTS[kind](found.value), found.meaning)


def _whole(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` covers all of its storage, element by element in order."""
    return (tensor.storage_offset() == 0 and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() == tensor.untyped_storage().nbytes())


def _same_layout(source: torch.Tensor, target: torch.Tensor) -> bool:
    return _whole(source) and _whole(target) and source.dtype == target.dtype


_CASTS: dict[str, Callable] = {"bool": bool, "int": int, "float": float}


def _scalar_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype.is_floating_point or dtype.is_complex else "int"
