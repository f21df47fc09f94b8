"""What a model builder accepts, as ``name=default`` (for ``memcalc models`` and for the
error that names a wrong ``--model-arg``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable


def builder_arguments(builder: Callable) -> list[str]:
    """Keyword arguments of ``builder``: ``name=default`` or ``name`` when required; empty
    when it takes ``**kwargs`` only or its signature cannot be read."""
    try:
        parameters = inspect.signature(builder).parameters.values()
    except (TypeError, ValueError):
        return []
    return [name if parameter.default is inspect.Parameter.empty
            else f"{name}={parameter.default!r}"
            for name, parameter in ((p.name, p) for p in parameters)
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)]


def unknown_arguments(builder: Callable, given: dict) -> list[str]:
    """The names in ``given`` that ``builder`` does not take (none when it takes
    ``**kwargs`` or its signature cannot be read)."""
    try:
        parameters = inspect.signature(builder).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return []
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return sorted(set(given) - names)
