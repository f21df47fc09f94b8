"""``package.module:callable`` references to the user's code (models, datasets)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from torch.utils.data import IterableDataset

from memcalc.errors import InputError, UserCodeError, at_user_frame, first_line


def import_callable(reference: str, what: str, error: type[InputError] = InputError
                    ) -> Callable[..., Any]:
    """Import ``package.module:attr.path`` from the current directory or the environment;
    ``what`` names it in errors ("model", "dataset")."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise error(f"{what} reference {reference!r} must look like package.module:callable")
    if module_name.startswith("."):
        raise error(f"{what} reference {reference!r} is relative; name the module from the "
                    "top, as `python -m` would (package.module:callable)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the user's project is importable
    module = _import_users_module(module_name, reference, what, error)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise error(f"{module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise error(f"{reference!r} is a {type(target).__name__}, not a callable")
    return target


def _import_users_module(module_name: str, reference: str, what: str,
                         error: type[InputError]) -> Any:
    """Import the user's module; whatever its top-level code raises or exits with becomes one
    error naming the module and the user's file:line."""
    try:
        return importlib.import_module(module_name)
    except ImportError as import_error:
        raise error(
            f"cannot import {module_name!r} for {what} {reference!r}: {import_error}; "
            "run from the directory that holds it or install it"
        ) from import_error
    except SyntaxError as syntax:
        raise UserCodeError(f"{what} module {module_name!r} has a syntax error at "
                            f"{syntax.filename}:{syntax.lineno}: {syntax.msg}") from syntax
    except SystemExit as exiting:
        raise UserCodeError(f"importing {what} module {module_name!r} called sys.exit"
                            f"({exiting.code!r}){at_user_frame(exiting)}") from exiting
    except Exception as failure:   # top-level code of the user's module may raise anything
        raise UserCodeError(f"importing {what} module {module_name!r} raised "
                            f"{type(failure).__name__}: {first_line(failure)}"
                            f"{at_user_frame(failure)}") from failure


def load_dataset(reference: str) -> Any:
    """Build the user's Dataset from ``package.module:callable`` and check it is one memcalc
    can measure: map-style (``__getitem__`` and ``__len__``) and not empty."""
    dataset = import_callable(reference, "dataset")()
    kind = type(dataset).__name__
    if isinstance(dataset, IterableDataset):
        raise InputError(f"dataset {reference!r} is an IterableDataset ({kind}); memcalc "
                         "measures map-style Datasets (__getitem__ and __len__): give one, "
                         "or --shape for the arithmetic")
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise InputError(f"dataset {reference!r} returned {kind}, not a Dataset; the callable "
                         "must build and return one (with __getitem__ and __len__)")
    if len(dataset) == 0:
        raise InputError(f"dataset {reference!r} has 0 samples; give one with data")
    return dataset
