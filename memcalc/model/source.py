"""Find the model a spec names and build it on the ``meta`` device (no weights allocated)."""

from __future__ import annotations

import copy
import difflib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memcalc.errors import (
    MemcalcError,
    ModelSourceError,
    UserCodeError,
    at_user_frame,
    first_line,
    user_frame,
)
from memcalc.model.builder_arguments import builder_arguments, unknown_arguments
from memcalc.model.build import (BuildTooLargeError, build_with_meta_states,
                                  built_for_real, mark_built_for_real)
from memcalc.model.user_code import import_callable
from models_zoo import ZOO


@dataclass(frozen=True)
class ModelSource:
    """How to build a model, and what its samples look like when the zoo knows."""

    name: str
    factory: Callable[..., nn.Module]
    kwargs: dict[str, Any]
    default_shape: tuple[int, ...] | None
    default_input_dtype: str | None
    instance: nn.Module | None = None
    """The caller's model object, when one was passed (its twins do not keep everything of
    it: a copy drops ``Module.compile()``'s state)."""

    def build_meta(self) -> nn.Module:
        """Call the factory once on the CPU with its parameters and buffers on ``meta``
        (``memcalc.model.build``); check it returns a Module. Whatever the user's code raises
        becomes a ModelSourceError naming it."""
        unknown = unknown_arguments(self.factory, self.kwargs)
        if unknown:
            accepted = ", ".join(builder_arguments(self.factory)) or "none"
            raise ModelSourceError(f"model {self.name!r} takes no argument "
                                   f"{', '.join(map(repr, unknown))}; it accepts: {accepted} "
                                   "(--model-arg NAME=VALUE)")
        try:
            model = build_with_meta_states(self.factory, self.kwargs)
        except MemcalcError:
            raise
        except BuildTooLargeError as error:
            raise ModelSourceError(f"model {self.name!r} cannot be built here: {error}"
                                   ) from None
        except SystemExit as error:
            raise UserCodeError(f"model {self.name!r}: its builder called sys.exit"
                                f"({error.code!r}){at_user_frame(error)}; it must return the model"
                                ) from error
        except Exception as error:  # the user's builder may raise anything
            raised = f"{type(error).__name__}: {first_line(error)}{at_user_frame(error)}"
            if _refused_arguments(error):
                raise ModelSourceError(f"model {self.name!r} rejected its arguments: {raised}"
                                       ) from error
            raise UserCodeError(f"model {self.name!r} failed to build: {raised}") from error
        if not isinstance(model, nn.Module):
            raise ModelSourceError(
                f"{self.name!r} returned {type(model).__name__}, not a torch.nn.Module; "
                "the callable must build and return the model"
            )
        if not _holds_real_states(model):
            return model
        # states made before the call (the factory returned a model the caller holds) or
        # assigned around the hooks: copied to meta, the caller's model left as it is
        try:
            twin = meta_twin(model)
            if built_for_real(model):
                mark_built_for_real(twin)
            return twin
        except Exception as error:  # deepcopy of user objects (locks, generators) may fail
            raise ModelSourceError(
                f"{self.name!r} returned a model with real weights that cannot be copied "
                f"({type(error).__name__}: {first_line(error)}); memcalc never moves the "
                "caller's weights: let the callable build a new model") from error

    def copier(self, model: nn.Module) -> Callable[[], nn.Module]:
        """Fresh meta copies of ``model`` (this source's one build), one per trace; a model
        that cannot be deep-copied is built again instead."""
        def copy_of_model() -> nn.Module:
            try:
                return meta_twin(model)
            except Exception:  # deepcopy of user objects (locks, generators) may fail
                return self.build_meta()
        return copy_of_model


def _holds_real_states(model: nn.Module) -> bool:
    """Some parameter or buffer is off ``meta`` (made before or around the build's hooks)."""
    return any(tensor.device.type != "meta"
               for tensor in (*model.parameters(), *model.buffers()))


def _refused_arguments(error: Exception) -> bool:
    """A builder refusing what it was given: a ValueError, or a TypeError from the call itself
    (a TypeError raised inside the builder's body is a bug in it)."""
    return isinstance(error, ValueError) or (isinstance(error, TypeError)
                                             and user_frame(error.__traceback__) is None)


_OBJECTS: dict[str, Any] = {}
"""Models passed to the library as objects, held only while a call that got them runs."""
_CALLS_HOLDING: dict[str, int] = {}
"""How many running calls (nested, or in other threads) hold each of ``_OBJECTS``."""
_HOLDING = threading.Lock()
OBJECT_PREFIX = "object:"


@contextmanager
def model_reference(model: str | nn.Module | Callable[..., nn.Module]) -> Iterator[str]:
    """The name of ``model`` as ``TrainingSpec.model`` inside the block: a string as it is; an
    ``nn.Module`` instance (traced as a meta twin) or a factory under an ``object:`` name that
    resolves only until the block ends, so the caller's model is never kept alive by memcalc."""
    if isinstance(model, str):
        yield model
        return
    # a torch.compile wrapper is named after the module it compiles (its ``_orig_mod``)
    kind = (type(getattr(model, "_orig_mod", model)).__name__ if isinstance(model, nn.Module)
            else getattr(model, "__qualname__", type(model).__name__))
    name = f"{OBJECT_PREFIX}{kind}@{id(model):x}"
    with _HOLDING:       # the same object in nested or concurrent calls: the last one lets go
        _OBJECTS[name] = model
        _CALLS_HOLDING[name] = _CALLS_HOLDING.get(name, 0) + 1
    try:
        yield name
    finally:
        with _HOLDING:
            _CALLS_HOLDING[name] -= 1
            if not _CALLS_HOLDING[name]:
                del _CALLS_HOLDING[name], _OBJECTS[name]


def display_name(name: str) -> str:
    """``object:VolumeNet@7f…`` → ``VolumeNet (instance)``; other names unchanged."""
    if not name.startswith(OBJECT_PREFIX):
        return name
    kind = name.removeprefix(OBJECT_PREFIX).rsplit("@", 1)[0]
    return f"{kind} ({'instance' if isinstance(_OBJECTS.get(name), nn.Module) else 'factory'})"


def meta_twin(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are meta tensors: the real weights are
    neither copied nor moved (deepcopy sees them already "copied" in its memo)."""
    memo: dict[int, Any] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = nn.Parameter(torch.empty_like(parameter, device="meta"),
                                           requires_grad=parameter.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    for value in _shared_attributes(model):
        memo[id(value)] = value
    return copy.deepcopy(model, memo)


_COPIED = (torch.Tensor, nn.Module, list, tuple, dict, set)
"""Attribute values a twin gets its own copy of: what the trace may change or run."""


def _shared_attributes(model: nn.Module) -> Iterator[Any]:
    """The user's own attributes that are neither tensors, modules nor containers (a numpy
    array, a logging handler, a lock): the twin shares them, so they are never copied (a
    large array was copied for every trace) nor pickled (a lock cannot be). Torch's own
    bookkeeping (names from ``_``) is copied, so hooks the trace adds stay on the twin."""
    for module in model.modules():
        for name, value in vars(module).items():
            if not name.startswith("_") and not isinstance(value, _COPIED):
                yield value


def resolve_model(name: str, kwargs: dict[str, Any] | None = None) -> ModelSource:
    """A zoo name (``resnet3d``), ``package.module:callable``, or a registered object."""
    kwargs = dict(kwargs or {})
    if name.startswith(OBJECT_PREFIX) and name not in _OBJECTS:
        kind = name.removeprefix(OBJECT_PREFIX).rsplit("@", 1)[0]
        raise ModelSourceError(f"the {kind} object was passed to an earlier call and is not "
                               "kept; pass the model object itself again")
    if name in _OBJECTS:
        target = _OBJECTS[name]
        if isinstance(target, nn.Module):
            return ModelSource(name, lambda: meta_twin(target), {}, None, None, target)
        return ModelSource(name, target, kwargs, None, None)
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
