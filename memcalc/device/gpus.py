"""The GPU catalog (``memcalc/data/gpus.json``): memory, compute capability, peak rates.

Hardware facts live in the data file, not in code; adding a card is one JSON row.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, computed_field

from memcalc.errors import InputError

MIB = 1 << 20


class GpuSpec(BaseModel):
    """One catalog row. TFLOP/s are dense peaks; None where the card has no such mode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    aliases: list[str]
    architecture: str
    compute_capability: str
    memory_mib: int
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float | None
    fp16_tflops: float | None
    memory_bandwidth_gbps: float
    source: str

    @computed_field
    @property
    def memory_bytes(self) -> int:
        """Total device memory as nvidia-smi reports it."""
        return self.memory_mib * MIB

    @property
    def compute_capability_tuple(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


@lru_cache(maxsize=1)
def gpu_catalog() -> tuple[GpuSpec, ...]:
    """Every catalog row, in file order."""
    text = resources.files("memcalc").joinpath("data/gpus.json").read_text(encoding="utf-8")
    return tuple(GpuSpec.model_validate(row) for row in json.loads(text)["gpus"])


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def find_gpu(name: str) -> GpuSpec:
    """Look a card up by name or alias, ignoring case, spaces, dashes and underscores."""
    wanted = _key(name)
    by_key = {_key(label): gpu for gpu in gpu_catalog() for label in (gpu.name, *gpu.aliases)}
    if wanted in by_key:
        return by_key[wanted]
    names = [gpu.name for gpu in gpu_catalog()]
    variants = [gpu.name for gpu in gpu_catalog() if wanted and _key(gpu.name).startswith(wanted)]
    if len(variants) > 1:
        raise InputError(f"GPU {name!r} is ambiguous: which one, {' or '.join(variants)}? "
                         "(see `memcalc gpus`)")
    close = [gpu.name for gpu in gpu_catalog()
             if wanted and any(wanted in _key(label) for label in (gpu.name, *gpu.aliases))]
    close += [match for match in difflib.get_close_matches(name, names, n=3, cutoff=0.4)
              if match not in close]
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(names)}"
    raise InputError(f"unknown GPU {name!r}; {hint} (see `memcalc gpus`, or give --gpu-memory)")
