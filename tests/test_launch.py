"""Launch artefacts: the torchrun line and the SLURM header sized by the host plan."""

from memcalc.host import HostSpec, MachineSpec, host_estimate
from memcalc.strategies.launch import slurm_header, torchrun_command
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
