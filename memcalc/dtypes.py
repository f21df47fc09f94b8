"""The one dtype table: the names users give (options, specs, a measured sample's dtype), the
torch dtype each names, and its size in bytes."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "bool": torch.bool,
}

INPUT_DTYPES: dict[str, torch.dtype] = {name: DTYPES[name] for name in (
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8")}
"""The dtypes a model's input batch may have (``--input-dtype``)."""


def dtype_bytes(name: str) -> int:
    """Bytes per element of the dtype called ``name``; ValueError for a name not in the table."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; accepted: {', '.join(DTYPES)}")
    return DTYPES[name].itemsize


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return dtype.itemsize
