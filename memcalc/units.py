"""Byte quantities: IEC formatting for display. Internally every size is an int of bytes."""

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
