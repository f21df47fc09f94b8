"""Find the model a spec names and build it on the ``meta`` device (no weights allocated)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memcalc.errors import ModelSourceError
from memcalc.references import import_callable
from models_zoo import ZOO


@dataclass(frozen=True)
class ModelSource:
    """How to build a model, and what its samples look like when the zoo knows."""

    name: str
    factory: Callable[..., nn.Module]
    kwargs: dict[str, Any]
    default_shape: tuple[int, ...] | None
    default_input_dtype: str | None

    def build_meta(self) -> nn.Module:
        """Call the factory with ``meta`` as the default device; check it returns a Module."""
        try:
            with torch.device("meta"):
                model = self.factory(**self.kwargs)
        except TypeError as error:
            raise ModelSourceError(f"model {self.name!r} rejected its arguments: {error}") from error
        except ValueError as error:
            raise ModelSourceError(f"model {self.name!r}: {error}") from error
        if not isinstance(model, nn.Module):
            raise ModelSourceError(
                f"{self.name!r} returned {type(model).__name__}, not a torch.nn.Module; "
                "the callable must build and return the model"
            )
        return model


def resolve_model(name: str, kwargs: dict[str, Any] | None = None) -> ModelSource:
    """A zoo name (``resnet3d``) or ``package.module:callable``."""
    kwargs = dict(kwargs or {})
    if ":" in name:
        return ModelSource(name, import_callable(name, "model", ModelSourceError), kwargs, None, None)
    if name not in ZOO:
        close = difflib.get_close_matches(name, list(ZOO), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelSourceError(
            f"unknown model {name!r}{hint}; zoo models: {', '.join(ZOO)}, "
            "or give package.module:callable"
        )
    entry = ZOO[name]
    return ModelSource(name, entry.build, kwargs, entry.default_shape, entry.input_dtype)
