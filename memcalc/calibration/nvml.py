"""GPU memory as nvidia-smi counts it, read through NVML (``nvidia-ml-py``, import name pynvml)."""

from __future__ import annotations

import os
from functools import lru_cache


@lru_cache(maxsize=1)
def _handle():
    import pynvml

    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    index = int(visible) if visible.isdigit() else 0
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def process_used_bytes(pid: int | None = None) -> int | None:
    """Device memory NVML charges to ``pid`` (this process by default); None when NVML does
    not list it (no context yet, or a container that hides process ids)."""
    import pynvml

    pid = os.getpid() if pid is None else pid
    for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses"):
        getter = getattr(pynvml, name, None)
        if getter is None:
            continue
        try:
            processes = getter(_handle())
        except pynvml.NVMLError:
            continue
        for process in processes:
            if process.pid == pid and process.usedGpuMemory is not None:
                return int(process.usedGpuMemory)
        return None
    return None


def device_used_bytes() -> int:
    """``memory.used`` of the whole device, as ``nvidia-smi --query-gpu=memory.used`` shows."""
    import pynvml

    return int(pynvml.nvmlDeviceGetMemoryInfo(_handle()).used)


def device_total_bytes() -> int:
    import pynvml

    return int(pynvml.nvmlDeviceGetMemoryInfo(_handle()).total)


def driver_version() -> str:
    import pynvml

    _handle()   # NVML initialised: this may be the process's first NVML call
    version = pynvml.nvmlSystemGetDriverVersion()
    return version.decode() if isinstance(version, bytes) else str(version)
