"""Spatial parallelism against real halo-exchanging ranks on a gloo group: every rank's
profiler peak next to the trace of one slab, and the unsharded step next to its own trace.
Prints the table and writes benchmarks/results-spatial.md.

    python -m benchmarks.spatial
"""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

import torch

from benchmarks.results import publish
from tests.fixtures.gloo import run_ranks
from tests.fixtures.spatial_reference import spatial_rank, traced_bytes, unsharded_peak_bytes

RESULTS = Path(__file__).with_name("results-spatial.md")
CASES = [((2, 2, 64, 48, 48), 2), ((2, 2, 64, 48, 48), 4),
         ((2, 2, 128, 32, 32), 2), ((2, 2, 128, 32, 32), 4)]
"""(batch shape, ranks); the depth axis divides evenly, as the reference needs."""


def row(batch_shape: tuple[int, ...], world: int) -> str:
    ranks = run_ranks(spatial_rank, world, batch_shape)
    rank_peak = max(peak for *_, peak in ranks)
    slab, whole = traced_bytes(batch_shape, world), traced_bytes(batch_shape, 1)
    unsharded = unsharded_peak_bytes(batch_shape)
    deviation = max(max(output, grad) for _, output, grad, _ in ranks)
    return (f"| {'×'.join(map(str, batch_shape))} | {world} | {rank_peak:,} | {slab:,} | "
            f"{100 * (slab - rank_peak) / rank_peak:+.1f} % | {unsharded:,} | {whole:,} | "
            f"{100 * (whole - unsharded) / unsharded:+.1f} % | {deviation:.1e} |")


def main() -> None:
    lines = [
        f"Measured {datetime.date.today()} on {platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}; CPU, gloo, profiler memory "
        "timeline. Regenerate with `python -m benchmarks.spatial`.",
        "",
        "`tests/fixtures/spatial_reference.py:halo_net` (no normalisation, so the ranks must reproduce "
        "the unsharded model): each rank holds 1/ranks of every volume's depth and receives "
        "its halos by point-to-point messages. \"max |diff|\" is the largest difference of the "
        "ranks' outputs and all-reduced gradients from the unsharded model's. Every "
        "convolution, real and traced, runs ATen's native path (oneDNN set aside: "
        "`spatial_reference.native_convolutions`): oneDNN picks its algorithms and their "
        "scratch by CPU model and shape, which a trace does not follow, while the native "
        "path's column buffers it counts.",
        "",
        "| batch shape | ranks | real rank peak (B) | trace of one slab (B) | error | "
        "real unsharded (B) | trace unsharded (B) | error | max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [row(batch_shape, world) for batch_shape, world in CASES]
    publish(RESULTS, "memcalc spatial-parallelism benchmark", lines)


if __name__ == "__main__":
    main()
