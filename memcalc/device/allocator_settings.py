"""``PYTORCH_CUDA_ALLOC_CONF`` as the caching allocator reads it, and its size rounding.

Options modelled: ``expandable_segments``, ``max_split_size_mb``,
``roundup_power2_divisions`` (one value, or ``[256:4, 512:2, >:1]`` per power-of-two size
interval in MiB). Rules follow ``c10/cuda/CUDAAllocatorConfig.cpp`` and
``CUDACachingAllocator.cpp`` (torch 2.x). Others (``garbage_collection_threshold``,
``pinned_*``) are kept as given and listed as not modelled.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from memcalc.errors import InputError

MIB = 1 << 20
MIN_BLOCK_SIZE = 512                # kMinBlockSize
ROUNDUP_INTERVALS = 16              # kRoundUpPowerOfTwoIntervals: 1 MiB ... 64 GiB
_INTERVAL_START_LOG2 = 20           # the first interval starts at 1 MiB


class AllocatorSettings(BaseModel):
    """The allocator options that change how much memory is reserved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    expandable_segments: bool = False
    max_split_size_bytes: int | None = Field(default=None, gt=0)
    """Blocks this large or larger are never split (None: no limit, the default)."""
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    """Divisions per power-of-two interval, from [1, 2) MiB up; 0 or 1 means 512 B rounding."""
    not_modelled: tuple[str, ...] = ()
    """Options given that the model ignores."""

    @classmethod
    def from_conf(cls, conf: str | None) -> AllocatorSettings:
        """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string (``key:value,key:value``)."""
        fields: dict = {}
        ignored: list[str] = []
        for key, value in _options(conf or ""):
            if key == "expandable_segments":
                fields["expandable_segments"] = _boolean(key, value)
            elif key == "max_split_size_mb":
                fields["max_split_size_bytes"] = _positive(key, value) * MIB
            elif key == "roundup_power2_divisions":
                fields["roundup_power2_divisions"] = _divisions(value)
            else:
                ignored.append(key)
        return cls(**fields, not_modelled=tuple(ignored))

    @property
    def is_default(self) -> bool:
        return self == AllocatorSettings(not_modelled=self.not_modelled)

    def divisions_for(self, size: int) -> int:
        log_size = size.bit_length() - 1
        index = max(0, log_size - _INTERVAL_START_LOG2)
        return self.roundup_power2_divisions[min(index, ROUNDUP_INTERVALS - 1)]

    def round_size(self, nbytes: int) -> int:
        """Request size after rounding (``round_size`` in CUDACachingAllocator.cpp)."""
        if nbytes < MIN_BLOCK_SIZE:
            return MIN_BLOCK_SIZE
        divisions = self.divisions_for(nbytes)
        if divisions > 1 and nbytes > MIN_BLOCK_SIZE * divisions:
            return _next_division(nbytes, divisions)
        return MIN_BLOCK_SIZE * -(-nbytes // MIN_BLOCK_SIZE)

    def oversize(self, size: int) -> bool:
        return self.max_split_size_bytes is not None and size >= self.max_split_size_bytes


def _next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: the next of ``divisions`` steps between powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def _options(conf: str) -> list[tuple[str, str]]:
    pairs, depth, current = [], 0, ""
    for char in conf + ",":
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            if current.strip():
                key, sep, value = current.partition(":")
                if not sep:
                    raise InputError(f"allocator setting {current.strip()!r} has no value; "
                                     "write key:value, e.g. expandable_segments:True")
                pairs.append((key.strip(), value.strip()))
            current = ""
        else:
            current += char
    return pairs


def _boolean(key: str, value: str) -> bool:
    if value not in ("True", "False"):
        raise InputError(f"allocator setting {key}:{value}: use True or False")
    return value == "True"


def _positive(key: str, value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise InputError(f"allocator setting {key}:{value}: use a positive whole number of MiB")
    return int(value)


def _power_of_two_divisions(value: str) -> int:
    if not value.isdigit() or int(value) & (int(value) - 1):
        raise InputError(f"roundup_power2_divisions:{value}: divisions must be a power of two")
    return int(value)


def _divisions(value: str) -> tuple[int, ...]:
    if not value.startswith("["):
        return (_power_of_two_divisions(value),) * ROUNDUP_INTERVALS
    table, last, first = [0] * ROUNDUP_INTERVALS, 0, True
    for item in value.strip("[]").split(","):
        bound, _, divisions = item.partition(":")
        count = _power_of_two_divisions(divisions.strip())
        bound = bound.strip()
        if bound == ">":
            table[last:] = [count] * (ROUNDUP_INTERVALS - last)
            continue
        if not bound.isdigit() or int(bound) & (int(bound) - 1):
            raise InputError(f"roundup_power2_divisions: interval {bound!r} must be a power of "
                             "two in MiB (e.g. [256:4, >:1])")
        index = min(int(bound).bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:  # the first interval's value also covers every smaller size
            table[:index] = [count] * index
            first = False
        table[index] = count
        last = index + 1
    return tuple(table)
