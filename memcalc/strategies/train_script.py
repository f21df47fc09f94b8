"""The launch artefact that carries the strategy: a ``train.py`` skeleton for a candidate,
with the plan's wrapping (DDP, ZeRO-1, ZeRO-2, FSDP2), precision, activation checkpointing,
offloading, compile, micro-batch and accumulation written out; the user fills in the
Dataset (and the model, where memcalc was given no importable builder).

Each lever and each wrapper is one registered snippet of code. A layout memcalc does not
write a script for (pipeline, spatial, DataParallel) is named in the script's first lines.

Known limitations: the loss is the plan's (cross-entropy, MSE or the model's own), the
optimizer AdamW or the job's; data loading is a plain ``DistributedSampler`` loader.
"""

from __future__ import annotations

from dataclasses import dataclass

from memcalc.specs import LossKind, TrainingSpec
from memcalc.strategies.report import Candidate
from memcalc.strategies.specs import Strategy

_WRAPPERS: dict[Strategy, str] = {
    Strategy.DDP: (
        "    model = DistributedDataParallel(model, device_ids=devices)\n"),
    Strategy.ZERO1: (
        "    model = DistributedDataParallel(model, device_ids=devices)\n"),
    Strategy.ZERO2: (
        "    shard_blocks(model, reshard_after_forward=False)   # ZeRO-2: gradients sharded\n"),
    Strategy.FSDP: (
        "    shard_blocks(model, reshard_after_forward=True)    # FSDP2: parameters sharded\n"),
    Strategy.FSDP_OFFLOAD: (
        "    shard_blocks(model, reshard_after_forward=True,    # FSDP2, states in host RAM\n"
        "                 offload_policy=CPUOffloadPolicy() if device.type == 'cuda' else None)\n"),
}
"""How each data-parallel layout wraps the model (one GPU: not at all)."""

_FSDP2 = (Strategy.FSDP, Strategy.ZERO2, Strategy.FSDP_OFFLOAD)
"""The layouts written with ``fully_shard``."""
_NOT_WRITTEN = {Strategy.PIPELINE: "torch.distributed.pipelining (stages, a schedule)",
                Strategy.SPATIAL: "a spatial split of each sample with halo exchanges",
                Strategy.DATA_PARALLEL: "torch.nn.DataParallel in one process"}
_CONTEXT_PARALLEL_NOT_WRITTEN = (
    "context parallelism (a (dp, cp) DeviceMesh, fully_shard over both dimensions, the "
    "sampler over dp only, each step inside torch's context_parallel(mesh['cp'], "
    "buffers=[inputs, targets], buffer_seq_dims=[1, 1]); MICRO_BATCH is per group of cp GPUs)")


@dataclass(frozen=True)
class Levers:
    """What the candidate turns on besides its layout, read from its label."""

    half: str | None
    """``bfloat16`` / ``float16`` under mixed precision, else None."""
    checkpointing: bool
    offload: bool
    compile: bool


def levers_of(candidate: Candidate, spec: TrainingSpec, half_dtype: str) -> Levers:
    label = candidate.label
    mixed = "mixed-precision" in label or spec.precision.value.endswith("-mixed")
    half = ("float16" if spec.precision.value.startswith("fp16") else half_dtype) if mixed else None
    return Levers(half=half,
                  checkpointing="checkpointing" in label or spec.activation_checkpointing is not None,
                  offload="+offload" in label or spec.offload_activations,   # not fsdp-offload
                  compile="compile" in label or spec.compile)


def train_script(candidate: Candidate, spec: TrainingSpec, torchrun: str, half_dtype: str,
                 num_workers: int, global_batch: int | None = None) -> str:
    """``train.py`` for ``candidate``; ``half_dtype``: the card's half precision for a
    mixed-precision lever (``bfloat16`` from Ampere on, else ``float16``). The job's own
    batch per GPU (``spec.batch_size``) where it fits and no global batch was asked, else the
    candidate's micro-batch and accumulation."""
    levers = levers_of(candidate, spec, half_dtype)
    micro, steps = max(candidate.max_batch_size, 1), candidate.accumulation_steps
    if spec.batch_size and global_batch is None and spec.batch_size <= micro:
        micro, steps = spec.batch_size, 1
    missing = _NOT_WRITTEN.get(candidate.strategy)
    if candidate.context_parallel > 1:
        missing = _CONTEXT_PARALLEL_NOT_WRITTEN
    fsdp = candidate.strategy in _FSDP2
    header = (f'"""Training skeleton for the plan: {candidate.label} on {candidate.gpus} '
              f'GPU(s), batch {micro} per GPU x {steps} accumulation step(s).\n\n'
              f"Launch: {torchrun}\n"
              "Fill in build_dataset() (and build_model() where it raises); the layout, "
              "precision,\ncheckpointing and batch sizes are the plan's.\n"
              + (f"NOT WRITTEN HERE: {missing}; the script runs the model as data parallel.\n"
                 if missing else "") + '"""\n')
    return "\n".join([
        header,
        _IMPORTS + (_FSDP_IMPORTS if fsdp else "") + (_ZERO1_IMPORTS
                                                      if candidate.strategy is Strategy.ZERO1 else ""),
        f"MICRO_BATCH = {micro}",
        f"ACCUMULATION_STEPS = {steps}",
        f"NUM_WORKERS = {num_workers}",
        "\n",
        _build_model(spec),
        _BUILD_DATASET,
        _blocks_code(fsdp, levers),
        _main(candidate, spec, levers, fsdp),
    ])


_IMPORTS = """import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
"""
_FSDP_IMPORTS = ("from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, "
                 "fully_shard\n")
_ZERO1_IMPORTS = "from torch.distributed.optim import ZeroRedundancyOptimizer\n"

_CHECKPOINTED = '''
def checkpointed(forward):
    def run(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run

'''

_BUILD_DATASET = '''
def build_dataset() -> torch.utils.data.Dataset:
    """Your Dataset: items of (input, target)."""
    raise NotImplementedError("build_dataset(): return your training Dataset")
'''


def _build_model(spec: TrainingSpec) -> str:
    arguments = ", ".join(f"{key}={value!r}" for key, value in spec.model_args.items())
    if ":" in spec.model:
        module, _, name = spec.model.partition(":")
        body = f"    from {module} import {name}\n\n    return {name}({arguments})"
    elif spec.model.isidentifier():
        body = (f"    from models_zoo import ZOO   # memcalc's zoo\n\n"
                f"    return ZOO[{spec.model!r}].build({arguments})")
    else:
        body = '    raise NotImplementedError("build_model(): return your nn.Module")'
    return f"def build_model() -> torch.nn.Module:\n{body}\n"


def _blocks_code(fsdp: bool, levers: Levers) -> str:
    """The repeated blocks (the class with the most parameters among those that repeat), as
    memcalc shards and checkpoints them."""
    if not (fsdp or levers.checkpointing):
        return ""
    code = '''
def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of the class that repeats and holds the most parameters."""
    kinds: dict[type, list[torch.nn.Module]] = {}
    for module in model.modules():
        if module is not model and any(True for _ in module.children()) and not isinstance(
                module, (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)):
            kinds.setdefault(type(module), []).append(module)
    repeated = {kind: found for kind, found in kinds.items() if len(found) >= 2}
    if not repeated:
        return []
    return max(repeated.values(), key=lambda found: sum(p.numel() for m in found
                                                         for p in m.parameters()))
'''
    if fsdp:
        policy = ("MixedPrecisionPolicy(param_dtype=torch.%s, reduce_dtype=torch.float32)"
                  % levers.half if levers.half else "MixedPrecisionPolicy()")
        code += f'''

def shard_blocks(model: torch.nn.Module, reshard_after_forward: bool,
                 offload_policy=None) -> None:
    """fully_shard per repeated block, then the root (torchtitan's order)."""
    policy = {policy}
    offload = {{"offload_policy": offload_policy}} if offload_policy is not None else {{}}
    for block in repeated_blocks(model):
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward,
                    **offload)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward,
                **offload)
'''
    return code


def _main(candidate: Candidate, spec: TrainingSpec, levers: Levers, fsdp: bool) -> str:
    wrap = _WRAPPERS.get(candidate.strategy, "    # one process per GPU, no wrapper\n")
    if candidate.strategy in _NOT_WRITTEN:
        wrap = _WRAPPERS[Strategy.DDP]
    optimizer = ("ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,"
                 " lr=1e-4)" if candidate.strategy is Strategy.ZERO1 else
                 "torch.optim.AdamW(model.parameters(), lr=1e-4)")
    # FSDP2's policy casts the parameters; elsewhere autocast runs the forward in half
    autocast = (f"torch.autocast(device.type, dtype=torch.{levers.half})"
                if levers.half and not fsdp else "contextlib.nullcontext()")
    offload = ("torch.autograd.graph.save_on_cpu(pin_memory=device.type == 'cuda')"
               if levers.offload else "contextlib.nullcontext()")
    scaler = levers.half == "float16" and not fsdp
    loss = {LossKind.MSE: "torch.nn.functional.mse_loss(output, targets)",
            LossKind.SUM: "output.float().sum()",
            LossKind.MODEL: "output.loss if hasattr(output, 'loss') else output['loss']"}.get(
        spec.loss, "torch.nn.functional.cross_entropy(output, targets)")
    checkpoint = ('''    for block in repeated_blocks(model):   # activation checkpointing per block
        block.forward = checkpointed(block.forward)
''' if levers.checkpointing else "")
    wrapper = (_CHECKPOINTED if levers.checkpointing else "")
    return wrapper + f'''
def main() -> None:
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = (torch.device("cuda", local_rank) if torch.cuda.is_available()
              else torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    devices = [local_rank] if device.type == "cuda" else None
    model = build_model().to(device)
{checkpoint}{"    model = torch.compile(model)" + chr(10) if levers.compile else ""}{wrap}    optimizer = {optimizer}
    scaler = torch.amp.GradScaler(enabled={scaler})
    dataset = build_dataset()
    loader = DataLoader(dataset, batch_size=MICRO_BATCH, sampler=DistributedSampler(dataset),
                        num_workers=NUM_WORKERS, pin_memory=device.type == "cuda",
                        persistent_workers=NUM_WORKERS > 0, drop_last=True)
    model.train()
    for step, (inputs, targets) in enumerate(loader):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with {autocast}, {offload}:
            output = model(inputs)
            loss = {loss} / ACCUMULATION_STEPS
        scaler.scale(loss).backward()
        if (step + 1) % ACCUMULATION_STEPS == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    dist.barrier()   # every rank done before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''
