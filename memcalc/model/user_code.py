"""``package.module:callable`` references to the user's code (models, datasets)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from memcalc.errors import InputError


def import_callable(reference: str, what: str, error: type[InputError] = InputError
                    ) -> Callable[..., Any]:
    """Import ``package.module:attr.path`` from the current directory or the environment;
    ``what`` names it in errors ("model", "dataset")."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise error(f"{what} reference {reference!r} must look like package.module:callable")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the user's project is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as import_error:
        raise error(
            f"cannot import {module_name!r} for {what} {reference!r}: {import_error}; "
            "run from the directory that holds it or install it"
        ) from import_error
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise error(f"{module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise error(f"{reference!r} is a {type(target).__name__}, not a callable")
    return target
