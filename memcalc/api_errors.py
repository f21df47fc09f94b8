"""The Python API's argument errors as one line naming the parameter as the caller wrote it.

A pydantic ``ValidationError`` from building a spec becomes an ``InputError``: the parameter
(``loader['num_workers']``), the value given and what is wrong; an unknown keyword names the
closest valid one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from pydantic import BaseModel, ValidationError

from memcalc.errors import InputError


def _field_names(model: type[BaseModel], seen: set | None = None) -> Iterator[str]:
    seen = seen if seen is not None else set()
    if model in seen:
        return
    seen.add(model)
    for name, field in model.model_fields.items():
        yield name
        for kind in getattr(field.annotation, "__args__", ()) or (field.annotation,):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from _field_names(kind, seen)


def argument_error(error: ValidationError, spec_types: tuple[type[BaseModel], ...],
                   parameters: tuple[str, ...] = ()) -> InputError:
    """One line for the first problem ``error`` holds, for a call whose keyword arguments
    fill ``spec_types`` (and the function's own ``parameters``)."""
    first = error.errors()[0]
    location = [str(part) for part in first["loc"]]
    name = location[0] + "".join(f"[{part!r}]" for part in location[1:]) if location else ""
    if first["type"] == "extra_forbidden":
        valid = sorted({*parameters, *(n for kind in spec_types for n in _field_names(kind))})
        close = difflib.get_close_matches(location[-1], valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(valid)}"
        return InputError(f"unknown argument {name!r}{hint}")
    message = first["msg"].removeprefix("Value error, ")
    given = f"={first['input']!r}" if "input" in first and location else ""
    return InputError(f"{name}{given}: {message}" if name else message)
