"""Launch artefacts: the torchrun line and the SLURM header sized by the host plan."""

import re

from memcalc.device.gpus import find_gpu
from memcalc.host import HostSpec, MachineSpec, host_estimate
from memcalc.specs import TrainingSpec
from memcalc.strategies.launch import launch_files, slurm_header, torchrun_command
from memcalc.strategies.report import Candidate
from memcalc.strategies.specs import ClusterSpec, Strategy

EIGHT = ClusterSpec(gpus_per_node=8)
DDP = Candidate(strategy=Strategy.DDP, label="ddp", gpus=8, method="traced rank",
                per_gpu_peak_bytes=70 << 30, max_batch_size=64, accumulation_steps=1,
                global_batch_size=512, flops_per_step=1e15, compute_s=0.3,
                communication_s=0.01, step_time_s=0.31, samples_per_s=1650.0, fits=True,
                notes=[])


def header(machine: MachineSpec) -> list[str]:
    host = host_estimate(HostSpec(sample_shape=(3, 224, 224), batch_size=64, machine=machine))
    return slurm_header(DDP, EIGHT, host)


def test_one_torchrun_per_node():
    assert torchrun_command(DDP, EIGHT) == ("torchrun --nnodes=1 --nproc-per-node=8 "
                                            "--standalone train.py")


def test_a_node_given_too_small_for_its_processes_does_not_fit():
    lines = header(MachineSpec(cpus=4, ram_bytes=64 << 30))
    assert "#SBATCH --cpus-per-task=4" in lines
    assert any(line.startswith("# DOES NOT FIT: 8 processes need") for line in lines)
    assert not any("WARNING" in line for line in lines)


def test_a_header_sized_on_this_machine_says_so_first():
    """Sized on the machine memcalc runs on (often a login node): a warning before the sizes,
    and its CPU count is not a verdict on the training node."""
    lines = header(MachineSpec(cpus=2, ram_bytes=16 << 30, source="detected"))
    warning = next(i for i, line in enumerate(lines) if line.startswith("# WARNING: sized on "
                                                                          "this machine (2 CPUs"))
    assert warning < next(i for i, line in enumerate(lines) if "--cpus-per-task" in line)
    assert not any("DOES NOT FIT" in line for line in lines)
    assert any(line.endswith("this machine has 2") for line in lines)


def files(machine: MachineSpec, num_workers: int | None = None) -> dict:
    host = host_estimate(HostSpec(sample_shape=(3, 224, 224), batch_size=64, machine=machine,
                                  loader={"num_workers": num_workers}))
    return launch_files(DDP, EIGHT, host, TrainingSpec(model="mlp", gpu="H100-80GB"),
                        find_gpu("H100-80GB"))


def _script_workers(script: str) -> int:
    return int(re.search(r"^NUM_WORKERS = (\d+)$", script, re.MULTILINE).group(1))


def test_train_py_runs_the_workers_the_header_gives_each_of_the_nodes_processes():
    """Eight processes share a node of 32 CPUs: train.py's DataLoader (one per process) and
    the SLURM header agree, and 8 × (workers + main) fit the node's CPUs."""
    made = files(MachineSpec(cpus=32, ram_bytes=256 << 30))
    workers = _script_workers(made["train_script"])
    assert f"# {workers} DataLoader workers per GPU process" in "\n".join(made["slurm"])
    assert 8 * (workers + 1) <= 32 and workers >= 1


def test_workers_given_per_process_are_kept_where_the_share_holds_them():
    assert _script_workers(files(MachineSpec(cpus=32, ram_bytes=256 << 30), 2)["train_script"]) == 2
    # 8 workers in each of 8 processes would be 64 on 32 CPUs: the share's own count instead
    assert _script_workers(files(MachineSpec(cpus=32, ram_bytes=256 << 30), 8)["train_script"]) <= 3
