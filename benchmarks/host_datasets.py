"""Small synthetic Datasets for the host-RAM tests and benchmark (``benchmarks.host_datasets:NAME``).

Volumes are 40 MiB float32 samples: above glibc's 32 MiB dynamic mmap threshold, so freed
samples go back to the OS and the arithmetic applies without heap growth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import Dataset

VOLUME_SHAPE = (10, 128, 128, 64)
SMALL_SHAPE = (4, 128, 128, 64)   # 16 MiB float32: inside glibc's dynamic threshold
OBJECT_ITEMS = 60_000
OBJECT_FLOATS = 64


class TensorVolumes(Dataset):
    def __init__(self, shape=VOLUME_SHAPE, length=64):
        self.shape, self.length = shape, length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return torch.full(self.shape, float(index)), index


class NumpyVolumes(TensorVolumes):
    def __getitem__(self, index):
        return {"volume": np.full(self.shape, index, dtype=np.float32), "label": index}


class Uint8Volumes(TensorVolumes):
    """Decoded as uint8, converted to float32 in place (one raw copy, no extra float copy)."""

    def __getitem__(self, index):
        raw = np.full(self.shape, index % 251, dtype=np.uint8)
        return torch.from_numpy(raw).float().div_(255.0)


class PythonObjects(Dataset):
    """A list of tuples of Python floats: what forked workers copy on read."""

    def __init__(self, items=OBJECT_ITEMS):
        self.items = [tuple(float(i + j) for j in range(OBJECT_FLOATS)) for i in range(items)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return torch.tensor(self.items[index])


def python_objects_bytes(items=OBJECT_ITEMS) -> int:
    """Closed form of the list: tuple header and pointers, float objects, list slot."""
    tuple_bytes = 40 + 8 * OBJECT_FLOATS + 16       # PyTuple + GC header
    return items * (tuple_bytes + 24 * OBJECT_FLOATS + 8)


def tensor_volumes():
    return TensorVolumes()


def numpy_volumes():
    return NumpyVolumes()


def uint8_volumes():
    return Uint8Volumes()


def small_volumes():
    return TensorVolumes(SMALL_SHAPE, length=400)


def python_objects():
    return PythonObjects()


def broken():
    class Broken(TensorVolumes):
        def __getitem__(self, index):
            raise KeyError(f"no file for item {index}")
    return Broken()


@dataclass(frozen=True)
class HostCase:
    """How a dataset is described to the shape arithmetic and how its truth run goes."""

    batch_size: int
    sample_shape: tuple[int, ...]
    loader_options: dict = field(default_factory=dict)
    truth_batches: int = 12
    truth_step_s: float = 0.05


OBJECT_BATCH = 256
HOST_CASES = {
    "tensor_volumes": HostCase(2, VOLUME_SHAPE),
    "numpy_volumes": HostCase(2, VOLUME_SHAPE),
    "uint8_volumes": HostCase(2, VOLUME_SHAPE, {"raw_dtype": "uint8"}),
    "python_objects": HostCase(OBJECT_BATCH, (OBJECT_FLOATS,),
                               {"dataset_bytes": python_objects_bytes(),
                                "dataset_python_objects": True},
                               truth_batches=OBJECT_ITEMS // OBJECT_BATCH, truth_step_s=0.0),
}


SPIN_SECONDS = 0.010


class SpinSamples(Dataset):
    """Each sample costs ``SPIN_SECONDS`` of CPU (a busy loop), like decoding and augmenting."""

    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        end = _now() + SPIN_SECONDS
        while _now() < end:
            pass
        return torch.full((3, 32, 32), float(index))


def spin_samples():
    return SpinSamples()


def _now() -> float:
    import time
    return time.perf_counter()
