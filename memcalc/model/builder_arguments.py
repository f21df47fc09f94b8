"""What a model builder accepts, as ``name=default`` (for ``memcalc models`` and for the
error that names a wrong ``--model-arg``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable


def _parameters(builder: Callable) -> list[inspect.Parameter] | None:
    """``builder``'s parameters; None when its signature cannot be read."""
    try:
        return list(inspect.signature(builder).parameters.values())
    except (TypeError, ValueError):
        return None


def _named(parameters: list[inspect.Parameter]) -> list[inspect.Parameter]:
    return [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def builder_arguments(builder: Callable) -> list[str]:
    """Keyword arguments of ``builder``: ``name=default`` or ``name`` when required; empty
    when it takes ``**kwargs`` only or its signature cannot be read."""
    return [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
            for p in _named(_parameters(builder) or [])]


def unknown_arguments(builder: Callable, given: dict) -> list[str]:
    """The names in ``given`` that ``builder`` does not take (none when it takes
    ``**kwargs`` or its signature cannot be read)."""
    parameters = _parameters(builder)
    if parameters is None or any(p.kind is p.VAR_KEYWORD for p in parameters):
        return []
    return sorted(set(given) - {p.name for p in _named(parameters)})
