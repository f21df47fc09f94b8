"""Measurements → an environment profile (pure: no GPU needed to build or test it)."""

from __future__ import annotations

from memcalc.trace.cudnn_workspace import MeasuredConv, WorkspaceModel, fit_rules
from memcalc.device.env_profile import EnvProfile, LibraryFloor


def floor_from_stages(cublas_first: dict, cudnn_first: dict) -> LibraryFloor:
    """From two fresh processes' stages (``environment.measure_floor``): one loading cuBLAS
    then cuDNN, one cuDNN then cuBLAS."""
    def outside(stages: dict, name: str) -> int:
        value = stages[name]["outside_bytes"]
        if value is None:
            raise ValueError("NVML does not list this process: the floor cannot be measured")
        return int(value)

    context = outside(cublas_first, "context")
    return LibraryFloor(
        context_bytes=context,
        cublas_bytes=outside(cublas_first, "cublas") - context,
        cudnn_bytes=outside(cudnn_first, "cudnn") - outside(cudnn_first, "context"),
        cudnn_after_cublas_bytes=outside(cublas_first, "cudnn") - outside(cublas_first, "cublas"),
    )


def workspace_model(plans: list[MeasuredConv], finds: list[MeasuredConv]) -> WorkspaceModel:
    """Rules for chosen-plan workspaces (every call after a signature's first with
    ``benchmark=False``, and any call without it) and for the plan search's buffer (the
    first call of each signature with ``benchmark=True``)."""
    plan_samples = [(record.call, record.transient_peak_bytes) for record in plans
                    if not record.call.benchmark]
    find_samples = [(record.call.model_copy(update={"benchmark": False}),
                     record.transient_peak_bytes) for record in finds
                    if record.call.benchmark and record.first_call]
    return WorkspaceModel(rules=fit_rules(plan_samples), find_rules=fit_rules(find_samples))


def build_profile(name: str, source: str, versions: dict[str, str], floor: LibraryFloor, *,
                  cublas_workspace_total_bytes: int, cublas_handles: int,
                  cudnn: WorkspaceModel, driver_reserved_bytes: int = 0) -> EnvProfile:
    """``cublas_workspace_total_bytes``: what stays allocated after a matmul forward and
    backward once every tensor is gone (one workspace per handle)."""
    per_handle = cublas_workspace_total_bytes // cublas_handles if cublas_handles else 0
    return EnvProfile(name=name, source=source, versions=versions, floor=floor,
                      cublas_workspace_bytes=per_handle or None, cublas_handles=cublas_handles,
                      cudnn=cudnn, driver_reserved_bytes=max(0, driver_reserved_bytes))
