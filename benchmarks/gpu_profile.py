"""Build memcalc's built-in environment profiles from the stored GPU measurements.

    python -m benchmarks.gpu_profile

``h100-torch2.11-cu130.json``: the floor and cuBLAS workspaces measured on the H100, and
cuDNN workspace rules fitted to the cuDNN calls of the first size of every measured model
only; the second sizes, the largest-batch runs and the calibration grid stay out of the fit
and test it. ``generic.json`` (any other card, until ``memcalc calibrate`` is run there):
the published floor figures memcalc used before, and the H100's cuDNN rules.
"""

from __future__ import annotations

import statistics
from importlib import resources

from benchmarks import gpu_data
from benchmarks.gpu_cases import CONV_NETS
from memcalc.calibration.profile_builder import build_profile, workspace_model
from memcalc.env_profile import EnvProfile, LibraryFloor, save_profile

MIB, MB = 1 << 20, 10**6
FOLDER = resources.files("memcalc").joinpath("data/env_profiles")


def fitted_case(name: str) -> bool:
    """The first measured size of each convolution net."""
    shape, batch = CONV_NETS.get(name.split()[0], [((), 0)])[0]
    return name.startswith(f"{name.split()[0]} b{batch}x{'x'.join(map(str, shape))} ")


def _cudnn_alone_bytes(steps: dict, context: int) -> int:
    """cuDNN's floor without cuBLAS: the 3D U-Net steps (convolutions, no matmul)."""
    outside = [row["nvml_process_after_bytes"] - row["reserved_after_bytes"]
               for row in steps["steps"] if row["case"]["model"] == "unet3d"]
    return int(statistics.median(outside)) - context


def h100_profile() -> EnvProfile:
    steps = gpu_data.steps()
    stages = steps["floor"]
    context = stages["context"]["outside_bytes"]
    floor = LibraryFloor(
        context_bytes=context,
        cublas_bytes=stages["cublas"]["outside_bytes"] - context,
        cudnn_bytes=_cudnn_alone_bytes(steps, context),
        cudnn_after_cublas_bytes=stages["cudnn"]["outside_bytes"] - stages["cublas"]["outside_bytes"])
    recorded = gpu_data.convs()
    plans = [r for name, records in recorded["plans"].items() if fitted_case(name) for r in records]
    finds = [r for name, records in recorded["finds"].items() if fitted_case(name) for r in records]
    return build_profile(
        name="h100-torch2.11-cu130",
        source="measured with python -m benchmarks.gpu on one H100 80GB HBM3, 2026-11-23; "
               "cuDNN rules fitted to the first size of four convolution nets",
        versions=steps["versions"], floor=floor,
        cublas_workspace_total_bytes=stages["cublas"]["allocated_bytes"], cublas_handles=2,
        cudnn=workspace_model(plans, finds),
        driver_reserved_bytes=(steps["baseline"]["device_total_bytes"]
                               - int(steps["versions"]["total_memory_bytes"])))


def generic_profile(h100: EnvProfile) -> EnvProfile:
    return EnvProfile(
        name="generic",
        source="published figures: context and cuBLAS together 648.5 MB from optimum-benchmark's "
               "GPT-2 training (torch 2.3.0+cu121), the bare lazy context 287 MB (pytorch#86509), "
               "cuDNN's kernels 250 MiB (a tiny CNN against a tiny MLP on one A100); cuDNN "
               "workspace rules borrowed from the H100 profile",
        versions={"gpu": "any", "torch": "2.x", "cuda": "12.x", "cudnn": "8.x/9.x",
                  "driver": "any"},
        floor=LibraryFloor(context_bytes=287 * MB, cublas_bytes=648_529_920 - 287 * MB,
                           cudnn_bytes=250 * MIB, cudnn_after_cublas_bytes=250 * MIB),
        cublas_workspace_bytes=None, cublas_handles=2, cudnn=h100.cudnn)


def main() -> None:
    h100 = h100_profile()
    for profile, name in ((h100, "h100-torch2.11-cu130.json"),
                          (generic_profile(h100), "generic.json")):
        path = save_profile(profile, FOLDER.joinpath(name))
        error, calls = profile.cudnn.error_summary()
        print(f"{path}: {len(profile.cudnn.rules)} rules from {calls} calls "
              f"({error:.1%} mean absolute error), {len(profile.cudnn.find_rules)} search rules")


if __name__ == "__main__":
    main()
