"""Which spec field each command-line option sets: one table, read both when the options
are turned into specs (``memcalc.cli.options``) and when a job file is overlaid by the options
given explicitly (``memcalc.cli.job_file``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OPTION_FIELDS: dict[str, str] = {
    "model_name": "model", "model_args": "model_args", "shape": "sample_shape",
    "layout": "layout", "input_dtype": "input_dtype", "inputs": "inputs",
    "forward_args": "forward_args", "boxes_per_image": "boxes_per_image",
    "batch_size": "batch_size", "loss": "loss", "optimizer": "optimizer",
    "optimizer_impl": "optimizer_impl", "weight_decay": "weight_decay", "amsgrad": "amsgrad",
    "zero_grad": "zero_grad_to_none", "free_output": "free_output", "phase": "phase",
    "eval_grad_mode": "eval_grad_mode", "eval_shape": "eval_sample_shape",
    "eval_batch_size": "eval_batch_size", "roi": "sliding_window",
    "sw_batch_size": "sliding_window", "overlap": "sliding_window", "sw_mode": "sliding_window",
    "volume_device": "sliding_window", "output_device": "sliding_window",
    "clip_grad_norm": "clip_grad_norm", "precision": "precision",
    "checkpointing": "activation_checkpointing", "offload_activations": "offload_activations",
    "compile_model": "compile",
    "spatial_parts": "spatial_parts", "device": "device", "gpu": "gpu",
    "gpu_memory": "gpu_memory_bytes", "headroom": "headroom_fraction",
    "cuda_module_loading": "cuda_module_loading", "cudnn_benchmark": "cudnn_benchmark",
    "cudnn_tf32": "cudnn_tf32", "allocator_conf": "allocator_conf",
    "env_profile": "env_profile",
    "step_time": "feed.step_time_s", "sample_time": "feed.sample_time_s",
    "read_bandwidth": "feed.read_bandwidth_bytes_per_s", "mfu": "feed.mfu",
    "num_workers": "loader.num_workers", "prefetch_factor": "loader.prefetch_factor",
    "pin_memory": "loader.pin_memory", "persistent_workers": "loader.persistent_workers",
    "start_method": "loader.start_method", "sample_dtype": "loader.sample_dtype",
    "raw_dtype": "loader.raw_dtype", "transform_copies": "loader.transform_copies",
    "dataset_ram": "loader.dataset_bytes", "python_objects": "loader.dataset_python_objects",
    "dataset": "loader.dataset", "input_key": "loader.input_key",
    "probe_seconds": "loader.probe_seconds", "host_headroom": "loader.headroom_fraction",
    "cpus": "machine", "ram": "machine", "mem_per_cpu": "machine", "shm": "machine",
}
"""Command-line option (its Python name) → the spec field it sets (dotted: nested). The
machine options set the machine as a whole: one given on the command line replaces the
file's machine, detected figures filling what the command line leaves out."""

WHOLE_FIELDS = ("machine", "sliding_window")
"""Fields that several options set together: one given replaces the file's field whole."""

_CONVERT: dict[str, Callable[[Any], Any]] = {
    "model_args": dict, "inputs": dict, "forward_args": dict,
    "zero_grad": lambda value: value == "none",
    "dataset_ram": lambda value: value or 0,
}
"""Options whose value is not the field's as it is: key=value pairs, a choice read as a flag."""


def take_fields(options: dict[str, Any], section: str = "") -> dict[str, Any]:
    """Pop from ``options`` those that set a field of ``section`` ("": the spec itself,
    "feed", "loader") and return them by field name. The machine and sliding-window options
    are left: each group sets its field as a whole (``memcalc.host.machine``,
    ``memcalc.cli.eval_options``)."""
    fields = {}
    for name, field in OPTION_FIELDS.items():
        head, _, last = field.rpartition(".")
        if head == section and field not in WHOLE_FIELDS and name in options:
            value = options.pop(name)
            fields[last] = _CONVERT[name](value) if name in _CONVERT else value
    return fields
