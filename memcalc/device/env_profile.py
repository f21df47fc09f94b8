"""What a CUDA environment adds to a training step, as one JSON profile.

A profile holds the device memory outside the caching allocator (CUDA context, cuBLAS and
cuDNN with lazy module loading), the cuBLAS workspaces allocated through it, and the cuDNN
workspace rules, each measured on one GPU with one driver, CUDA, cuDNN and torch.
``memcalc calibrate`` measures the user's own environment and writes one; estimates use,
in this order, ``--env-profile FILE``, ``$MEMCALC_ENV_PROFILE``, the file at
``default_profile_path()``, and else the built-in profile for the card's architecture.

Known limitations: a built-in profile describes the environment it was measured in; other
drivers, CUDA and cuDNN versions differ by up to a few hundred MiB outside the allocator
and choose other cuDNN plans.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from memcalc.trace.cudnn_workspace import WorkspaceModel
from memcalc.errors import InputError
from memcalc.device.gpus import GpuSpec

PROFILE_VARIABLE = "MEMCALC_ENV_PROFILE"
_BUILTIN_FOLDER = "data/env_profiles"
_ARCHITECTURE_PROFILE = {"hopper": "h100-torch2.11-cu130.json"}
_FALLBACK_PROFILE = "generic.json"


class LibraryFloor(BaseModel):
    """Device bytes outside the caching allocator (NVML's figure for the process minus
    ``memory_reserved``) after each library has run once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    context_bytes: int
    """The CUDA context after the first tensor."""
    cublas_bytes: int
    """Added by a matmul forward and backward (cuBLAS / cuBLASLt loaded)."""
    cudnn_bytes: int
    """Added by a convolution forward and backward when cuBLAS is not loaded."""
    cudnn_after_cublas_bytes: int
    """Added by the convolution when cuBLAS is loaded already (shared dependencies)."""

    def outside_bytes(self, uses_matmul: bool, uses_conv: bool) -> int:
        extra = self.cublas_bytes if uses_matmul else 0
        if uses_conv:
            extra += self.cudnn_after_cublas_bytes if uses_matmul else self.cudnn_bytes
        return self.context_bytes + extra


class EnvProfile(BaseModel):
    """One measured environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    source: str
    """How and where it was measured."""
    versions: dict[str, str]
    """gpu, compute_capability, torch, cuda, cudnn, driver, module loading, allocator conf."""
    floor: LibraryFloor
    cublas_workspace_bytes: int | None
    """One cuBLAS workspace (per handle and stream), allocated through the allocator; None:
    CublasHandlePool's rule for the card (``cuda_overheads.cublas_workspace_bytes``)."""
    cublas_handles: int = 2
    """Handles a training step holds: the forward thread's and autograd's device thread's."""
    driver_reserved_bytes: int = 0
    """Device memory nvidia-smi counts in the card's total that no process can use (NVML's
    total minus CUDA's); 0 when unknown."""
    cudnn: WorkspaceModel

    def describe(self) -> str:
        versions = self.versions
        return (f"environment profile {self.name!r} ({versions.get('gpu', '?')}, torch "
                f"{versions.get('torch', '?')}, CUDA {versions.get('cuda', '?')}, cuDNN "
                f"{versions.get('cudnn', '?')}, driver {versions.get('driver', '?')}; {self.source})")


def default_profile_path() -> Path:
    """Where ``memcalc calibrate`` writes and estimates look: ``$XDG_CONFIG_HOME`` (or
    ``~/.config``) ``/memcalc/env-profile.json``."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "memcalc" / "env-profile.json"


def load_profile(path: str | os.PathLike) -> EnvProfile:
    """Read a profile file; InputError naming the file when it is missing or not a profile."""
    try:
        return EnvProfile.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise InputError(f"environment profile {str(path)!r} does not exist; write one with "
                         "`memcalc calibrate` on the GPU machine") from None
    except (OSError, ValueError, ValidationError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"environment profile {str(path)!r} is not a memcalc profile ({first}); "
                         "write it again with `memcalc calibrate`") from None


def save_profile(profile: EnvProfile, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile.model_dump_json(indent=1) + "\n", encoding="utf-8")
    return path


@lru_cache(maxsize=8)
def builtin_profile(file_name: str) -> EnvProfile:
    text = resources.files("memcalc").joinpath(f"{_BUILTIN_FOLDER}/{file_name}").read_text(
        encoding="utf-8")
    return EnvProfile.model_validate(json.loads(text))


def builtin_names() -> list[str]:
    folder = resources.files("memcalc").joinpath(_BUILTIN_FOLDER)
    return sorted(entry.name.removesuffix(".json") for entry in folder.iterdir()
                  if entry.name.endswith(".json"))


def resolve_profile(explicit: str | None, gpu: GpuSpec | None) -> EnvProfile:
    """The profile an estimate uses (see the module docstring for the order); ``explicit``
    and ``$MEMCALC_ENV_PROFILE`` may also name a built-in profile."""
    for candidate in (explicit, os.environ.get(PROFILE_VARIABLE)):
        if candidate:
            if candidate in builtin_names() and not Path(candidate).exists():
                return builtin_profile(f"{candidate}.json")
            return load_profile(candidate)
    default = default_profile_path()
    if default.is_file():
        return load_profile(default)
    architecture = gpu.architecture if gpu else None
    return builtin_profile(_ARCHITECTURE_PROFILE.get(architecture, _FALLBACK_PROFILE))
