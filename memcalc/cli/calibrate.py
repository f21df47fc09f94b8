"""``memcalc calibrate``: measure this GPU machine's CUDA environment into a profile."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from memcalc.cli import output
from memcalc.cli.guard import run_guarded
from memcalc.device.env_profile import default_profile_path, save_profile
from memcalc.units import format_bytes


@click.command()
@click.option("--out", type=click.Path(dir_okay=False),
              help="Where to write the profile [default: ~/.config/memcalc/env-profile.json, "
                   "which estimates then use by default].")
@click.option("--name", help="Profile name [default: the GPU's name and today's date].")
@click.option("--json", "as_json", is_flag=True, help="Also print the profile as JSON.")
@click.pass_context
def calibrate(ctx, out, name, as_json) -> None:
    """Run on the machine that trains (about two minutes on its GPU): measure the CUDA
    context and library floor, cuBLAS workspaces and cuDNN convolution workspaces, and write
    an environment profile for estimate/plan/check --env-profile."""
    from memcalc.calibration.run import calibrate as measure

    def work():
        console = Console(stderr=True)
        profile = measure(name, progress=lambda message: console.print(f"[dim]{message}…[/]"))
        path = save_profile(profile, out or default_profile_path())
        if as_json:
            output.echo(profile.model_dump_json(indent=1))
        floor = profile.floor
        error, calls = profile.cudnn.error_summary()
        click.echo(
            f"profile {profile.name!r} written to {path}\n"
            f"  outside the allocator: context {format_bytes(floor.context_bytes)}, "
            f"+{format_bytes(floor.cublas_bytes)} cuBLAS, +{format_bytes(floor.cudnn_bytes)} "
            f"cuDNN ({format_bytes(floor.cudnn_after_cublas_bytes)} after cuBLAS); driver "
            f"reserves {format_bytes(profile.driver_reserved_bytes)}\n"
            f"  cuBLAS workspaces: {profile.cublas_handles} x "
            f"{format_bytes(profile.cublas_workspace_bytes or 0)}\n"
            f"  cuDNN workspace rules: {len(profile.cudnn.rules)} fitted to {calls} calls "
            f"({error:.0%} mean absolute error)\n"
            f"use it: memcalc estimate ... --env-profile {path}", file=sys.stderr if as_json else output.out())

    run_guarded(ctx, work)
