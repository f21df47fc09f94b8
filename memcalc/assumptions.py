"""The assumptions and the known gaps every report states, in words."""

from __future__ import annotations

from memcalc.optimizers import optimizer_rule
from memcalc.precision import precision_policy
from memcalc.specs import DeviceKind, LossKind, TrainingSpec

_LOSS_TEXT = {
    LossKind.CROSS_ENTROPY: (
        "loss: cross-entropy against int64 class targets shaped like the output minus its "
        "class dim (dim 1; the last dim for token-id models, flattened as in LM training)"
    ),
    LossKind.MSE: "loss: MSE against a float target shaped like the output",
    LossKind.SUM: "loss: output.sum() (no target)",
}


def assumptions(spec: TrainingSpec, *, model_has_conv: bool, foreach: bool,
                traced: bool) -> list[str]:
    rule = optimizer_rule(spec.optimizer)
    implementation = ("foreach implementation (CUDA's default; parameter-sized temporaries "
                      "during step())" if foreach else "for-loop implementation (CPU's default)")
    lines = [
        precision_policy(spec.precision).assumption,
        f"optimizer {rule.name}: {rule.description}; {rule.state_copies} parameter-sized state "
        f"tensor(s) per parameter" + (", plus a 4-byte step counter per parameter tensor"
                                       if rule.step_counter else "") + f"; {implementation}",
        _LOSS_TEXT[spec.loss],
        "model in train mode; every parameter trainable unless the model sets requires_grad=False",
    ]
    if traced:
        lines += [
            "traced on fake CPU tensors: 2 iterations of forward, loss, backward, optimizer "
            "step, zero_grad(set_to_none=True); the peak is the maximum over both, so the "
            "optimizer state created lazily at step 1 is included",
            "the step is a function: its output and loss are released when it returns (a "
            "plain for-loop that keeps `output` until the next forward holds it one step longer)",
            "activations = tensors made in forward and loss that are still alive when backward "
            "starts; temporaries = everything else the step makes",
        ]
    if spec.device is DeviceKind.CUDA and traced:
        lines.append(
            "CUDA reserved memory: the traced allocations and frees are replayed through a "
            "model of PyTorch's caching allocator (512 B rounding; requests up to 1 MiB packed "
            "in 2 MiB segments, 1-10 MiB in 20 MiB segments, larger rounded to 2 MiB; best fit "
            "with splitting and merging; default settings, one stream); peak_bytes is that "
            "reserved peak, reached without memory pressure: near capacity the allocator frees "
            "cached blocks and retries, so a run may still fit in less")
    if spec.device is DeviceKind.CPU and model_has_conv:
        lines.append("CPU convolutions (oneDNN/mkldnn) allocate workspaces the trace does not "
                     "see; a real CPU run of a conv net peaks higher (see README)")
    return lines


def unsupported(spec: TrainingSpec) -> list[str]:
    if spec.device is not DeviceKind.CUDA:
        return []
    return [
        "CUDA context and cuBLAS/cuDNN workspaces: not added to peak_bytes (nvidia-smi shows "
        "them on top)",
        "allocator settings (max_split_size_mb, expandable_segments, roundup_power2_divisions) "
        "and blocks held for other streams: not modelled",
        "kernel choice on CUDA (scaled-dot-product attention uses flash/memory-efficient "
        "kernels there): traced with the CPU kernels",
    ]
