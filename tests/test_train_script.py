"""The train.py skeleton a plan emits carries the strategy, and runs: each layout's script
trains on a real 2-process gloo group on the CPU with a Dataset filled in."""

import ast
import subprocess
import sys

import pytest

from memcalc.specs import TrainingSpec
from memcalc.strategies.report import Candidate
from memcalc.strategies.specs import Strategy
from memcalc.strategies.train_script import train_script

SPEC = TrainingSpec(model="tests.fixtures.models:blocks", model_args={"width": 16, "depth": 3},
                    sample_shape=(16,))
RUNNER = """import sys, torch
sys.path[:0] = [{folder!r}, {root!r}]
import train
from torch.utils.data import TensorDataset
generator = torch.Generator().manual_seed(0)
train.build_dataset = lambda: TensorDataset(torch.randn(32, 16, generator=generator),
                                            torch.randint(0, 16, (32,), generator=generator))
train.main()
print("TRAINED", flush=True)
import os
os._exit(0)   # torch's CPU teardown at exit aborts now and then ("terminate called without an
              # active exception", after the group is destroyed): the training is what is tested
"""


def _candidate(strategy: Strategy, label: str, micro: int = 4, steps: int = 2) -> Candidate:
    return Candidate(strategy=strategy, label=label, gpus=2, method="traced", fits=True,
                     per_gpu_peak_bytes=1 << 30, max_batch_size=micro, accumulation_steps=steps,
                     global_batch_size=micro * steps * 2, flops_per_step=1e9, compute_s=0.1,
                     communication_s=0.0, step_time_s=0.1, samples_per_s=80.0, notes=[])


def _script(strategy, label, spec=SPEC, **changes) -> str:
    return train_script(_candidate(strategy, label, **changes), spec,
                        "torchrun --nnodes=1 --nproc-per-node=2 --standalone train.py",
                        "bfloat16", num_workers=0)


@pytest.mark.parametrize("strategy, label, expected", [
    (Strategy.DDP, "ddp", ["DistributedDataParallel(model"]),
    (Strategy.ZERO1, "zero1", ["ZeroRedundancyOptimizer(", "DistributedDataParallel(model"]),
    (Strategy.ZERO2, "zero2 + mixed-precision", ["reshard_after_forward=False",
                                                  "param_dtype=torch.bfloat16"]),
    (Strategy.FSDP, "fsdp + mixed-precision+checkpointing",
     ["reshard_after_forward=True", "reduce_dtype=torch.float32", "checkpointed(block.forward)"]),
    (Strategy.MIXED_PRECISION_OFFLOAD, "mixed-precision+offload",
     ["torch.autocast(device.type, dtype=torch.bfloat16)", "save_on_cpu("]),
    (Strategy.FSDP_OFFLOAD, "fsdp-offload + mixed-precision",
     ["offload_policy=CPUOffloadPolicy() if device.type == 'cuda'", "reshard_after_forward=True",
      "param_dtype=torch.bfloat16"]),
])
def test_each_layout_and_lever_is_written_out(strategy, label, expected):
    script = _script(strategy, label)
    ast.parse(script)
    assert all(text in script for text in expected), script
    assert "MICRO_BATCH = 4" in script and "ACCUMULATION_STEPS = 2" in script
    assert "from tests.fixtures.models import blocks" in script
    # FSDP2's policy casts the parameters: no autocast on top of it
    assert ("torch.autocast" in script) == (strategy is Strategy.MIXED_PRECISION_OFFLOAD)
    # activations go to host RAM only with that lever, not with FSDP's offloaded states
    assert ("save_on_cpu(" in script) == (strategy is Strategy.MIXED_PRECISION_OFFLOAD)


def test_the_jobs_own_batch_is_kept_where_it_fits():
    script = _script(Strategy.DDP, "ddp", spec=SPEC.with_changes(batch_size=3), micro=8)
    assert "MICRO_BATCH = 3" in script and "ACCUMULATION_STEPS = 1" in script


def test_a_layout_not_written_says_so():
    script = _script(Strategy.PIPELINE, "pipeline")
    assert "NOT WRITTEN HERE: torch.distributed.pipelining" in script


@pytest.mark.slow
@pytest.mark.parametrize("strategy, label", [
    (Strategy.DDP, "ddp"), (Strategy.ZERO1, "zero1"),
    (Strategy.FSDP, "fsdp + mixed-precision+checkpointing"),
    (Strategy.ZERO2, "zero2"),
    (Strategy.FSDP_OFFLOAD, "fsdp-offload")])   # on the CPU without its policy (it needs a GPU)
def test_the_script_trains_on_two_gloo_processes(tmp_path, strategy, label):
    (tmp_path / "train.py").write_text(_script(strategy, label))
    (tmp_path / "run.py").write_text(RUNNER.format(folder=str(tmp_path),
                                                   root=str(__import__("pathlib").Path.cwd())))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "2", "--standalone", str(tmp_path / "run.py")],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("TRAINED") == 2
