"""Click parameter types of the command line: shapes, sizes, fractions, key=value."""

from __future__ import annotations

import math

import click

from memcalc.units import parse_size

MAX_SAMPLE_ELEMENTS = 1 << 50
"""Elements of one sample beyond which byte counts overflow: a typing mistake."""


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and inf (which pass its comparisons)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class ShapeType(click.ParamType):
    """``834,224,834,3`` → (834, 224, 834, 3); every dimension a positive integer."""

    name = "shape"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        try:
            dims = tuple(int(part) for part in parts)
        except ValueError:
            self.fail(f"shape must be positive integers separated by commas (e.g. 3,224,224), "
                      f"got {value!r}", param, ctx)
        if not dims or any(dim <= 0 for dim in dims):
            self.fail(f"shape dimensions must be positive integers, got {value!r}", param, ctx)
        if math.prod(dims) > MAX_SAMPLE_ELEMENTS:
            self.fail(f"shape {value!r} has {math.prod(dims):.3g} elements per sample, beyond any "
                      "memory (at most 2**50)", param, ctx)
        return dims


class CountListType(click.ParamType):
    """``0,1,2`` → [0, 1, 2]: counts of 0 or more, comma separated, none empty, sorted."""

    name = "counts"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            counts = sorted({int(part.strip()) for part in str(value).split(",")})
        except ValueError:
            self.fail(f"must be counts separated by commas (e.g. 0,1,2), got {value!r}",
                      param, ctx)
        if counts[0] < 0:
            self.fail(f"counts must be 0 or more, got {value!r}", param, ctx)
        return counts


class InputType(click.ParamType):
    """``attention_mask=512:int64`` → ("attention_mask", {"shape": (512,), "dtype": "int64"});
    the shape is per sample (``labels=:int64`` for one value per sample), dtype float32 if
    left out."""

    name = "name=shape[:dtype]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        name, sep, rest = str(value).partition("=")
        if not sep or not name.strip().isidentifier():
            self.fail(f"input must look like NAME=SHAPE[:DTYPE] (e.g. attention_mask=512:int64), "
                      f"got {value!r}", param, ctx)
        raw_shape, _, dtype = rest.partition(":")
        shape = ShapeType().convert(raw_shape, param, ctx) if raw_shape.strip() else ()
        return name.strip(), {"shape": shape, "dtype": dtype.strip() or "float32"}


class ModelArgType(click.ParamType):
    """``depth=50`` → ("depth", 50); values parsed as int, float, bool or string."""

    name = "key=value"

    def convert(self, value, param, ctx):
        key, sep, raw = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"model argument must look like key=value, got {value!r}", param, ctx)
        return key.strip(), parse_scalar(raw.strip())


class SizeType(click.ParamType):
    """``24GiB`` (binary) or ``24GB`` (decimal) → bytes."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


class FractionType(click.ParamType):
    """``0.05`` or ``5%`` → 0.05, in [0, 1)."""

    name = "fraction"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            self.fail(f"headroom must be a fraction like 0.05 or a percentage like 5%, got {value!r}",
                      param, ctx)
        if not 0 <= fraction < 1:
            self.fail(f"headroom must be at least 0 and below 100%, got {value!r}", param, ctx)
        return fraction


def parse_scalar(raw: str) -> int | float | bool | str | None:
    """``true``/``false`` → bool, ``none`` → None (``weights_backbone=none``), numbers, else
    the string."""
    if raw.lower() == "none":
        return None
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def enum_choice(enum_type) -> click.Choice:
    return click.Choice([member.value for member in enum_type], case_sensitive=False)
