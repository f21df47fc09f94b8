"""Byte quantities: IEC formatting for display. Internally every size is an int of bytes."""

import math
import re

_IEC_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(num_bytes: int | float) -> str:
    """Format a byte count with IEC binary units: ``format_bytes(1536) == '1.50 KiB'``."""
    value = float(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in _IEC_UNITS:
        if value < 1024 or unit == _IEC_UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(count: int) -> str:
    """Format a plain count with SI suffixes (parameters): ``format_count(6_738_415_616) == '6.74 B'``."""
    for divisor, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(count) >= divisor:
            return f"{count / divisor:.2f} {suffix}"
    return str(count)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``counted(1, "worker") == '1 worker'``, ``counted(2, "worker") == '2 workers'``."""
    return f"{count} {noun}" if count == 1 else f"{count} {plural or noun + 's'}"


MAX_SIZE_BYTES = 1 << 60
"""1 EiB: larger sizes are typing mistakes (and overflow int64 byte arithmetic)."""
_SIZE_FACTORS = {
    "": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}


_SIZE_PATTERN = re.compile(r"^([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_size(text: str) -> int:
    """Bytes in a size written by a person: ``24GiB`` (binary, 2**30) or ``24GB`` (decimal, 10**9).

    A bare number is bytes; units are case-insensitive. ``24G`` is refused because it is read
    both ways in practice.
    """
    cleaned = str(text).strip().replace(" ", "").replace("_", "")
    match = _SIZE_PATTERN.match(cleaned)
    if match is None:
        raise ValueError(f"size {text!r} does not start with a number; e.g. 24GiB or 80GB")
    number, unit = match.group(1), match.group(2).lower()
    if unit not in _SIZE_FACTORS:
        raise ValueError(f"size {text!r} has unit {unit!r}; use a number with B, KiB, MiB, GiB, "
                         "TiB (binary) or KB, MB, GB, TB (decimal), e.g. 24GiB")
    value = float(number) * _SIZE_FACTORS[unit]
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    if not math.isfinite(value) or value > MAX_SIZE_BYTES:
        raise ValueError(f"size {text!r} is beyond any machine (at most 1 EiB)")
    return int(value)
