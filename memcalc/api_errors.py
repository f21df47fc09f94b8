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


def _field_paths(model: type[BaseModel], path: tuple[str, ...] = (),
                 seen: set | None = None) -> Iterator[tuple[str, ...]]:
    """Every field of ``model`` and of the specs nested in it, as its path of names."""
    seen = seen if seen is not None else set()
    if model in seen:
        return
    seen.add(model)
    for name, field in model.model_fields.items():
        yield (*path, name)
        for kind in getattr(field.annotation, "__args__", ()) or (field.annotation,):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from _field_paths(kind, (*path, name), seen)


def _closest(name: str, paths: list[tuple[str, ...]], top_level: bool) -> tuple[str, ...] | None:
    """The path whose last name is closest to ``name``; for a keyword of the call itself,
    the call's own names first, then a nested spec's (never ``name`` itself: it was
    refused where it stands)."""
    tiers = ([path for path in paths if len(path) == 1], paths) if top_level else (paths,)
    for tier in tiers:
        tier = [path for path in tier if path != (name,)]
        by_name: dict[str, tuple[str, ...]] = {}
        for path in tier:
            by_name.setdefault(path[-1], path)
        close = difflib.get_close_matches(name, list(by_name), n=1)
        if close:
            return by_name[close[0]]
    return None


def _nested(path: tuple[str, ...]) -> str:
    """``parallel={'strategy': ...}`` for ("parallel", "strategy")."""
    inner = "..."
    for name in reversed(path[1:]):
        inner = f"{{{name!r}: {inner}}}"
    return f"{path[0]}={inner}"


def argument_error(error: ValidationError, spec_types: tuple[type[BaseModel], ...],
                   parameters: tuple[str, ...] = ()) -> InputError:
    """One line for the first problem ``error`` holds, for a call whose keyword arguments
    fill ``spec_types`` (and the function's own ``parameters``)."""
    first = error.errors()[0]
    location = [str(part) for part in first["loc"]]
    name = location[0] + "".join(f"[{part!r}]" for part in location[1:]) if location else ""
    if first["type"] == "extra_forbidden":
        paths = [(own,) for own in parameters] + [
            path for kind in spec_types for path in _field_paths(kind)]
        top_level = len(location) == 1
        close = _closest(location[-1], paths, top_level)
        if close is None:
            valid = sorted({path[0] for path in paths})
            hint = f"; valid: {', '.join(valid)}"
        else:
            hint = (f"; did you mean {_nested(close)}?" if top_level and len(close) > 1
                    else f"; did you mean {close[-1]!r}?")
        return InputError(f"unknown argument {name!r}{hint}")
    message = first["msg"].removeprefix("Value error, ")
    given = f"={first['input']!r}" if "input" in first and location else ""
    return InputError(f"{name}{given}: {message}" if name else message)
