"""Launch artefacts for the recommended strategy: a torchrun command, a SLURM header
consistent with the host plan (workers and RAM per training process), and a ``train.py``
skeleton that carries the strategy."""

from __future__ import annotations

import math

from memcalc.host.workers import host_estimate
from memcalc.host.report import HostReport
from memcalc.device.gpus import GpuSpec
from memcalc.specs import TrainingSpec
from memcalc.strategies.report import Candidate
from memcalc.strategies.train_script import train_script
from memcalc.strategies.specs import ClusterSpec
from memcalc.units import counted

SCRIPT = "train.py"


def launch_files(chosen: Candidate | None, cluster: ClusterSpec, host: HostReport | None,
                 spec: TrainingSpec, gpu: GpuSpec) -> dict:
    """The recommended candidate's torchrun line, SLURM header and ``train.py`` skeleton
    (all None when nothing is recommended)."""
    if chosen is None:
        return {"torchrun": None, "slurm": None, "train_script": None}
    torchrun = torchrun_command(chosen, cluster)
    # each GPU process's own DataLoader: the workers of its share of the node
    workers = (per_process_host(host, node_layout(chosen, cluster)[1]).num_workers
               if host is not None else 2)
    return {"torchrun": torchrun, "slurm": slurm_header(chosen, cluster, host),
            "train_script": train_script(chosen, spec, torchrun,
                                         "bfloat16" if gpu.bf16_tflops else "float16", workers,
                                         cluster.global_batch)}


def node_layout(candidate: Candidate, cluster: ClusterSpec) -> tuple[int, int]:
    """(nodes, GPUs per node) the candidate runs on."""
    per_node = cluster.gpus_per_node_for(candidate.gpus)
    return math.ceil(candidate.gpus / per_node), per_node


def torchrun_command(candidate: Candidate, cluster: ClusterSpec, script: str = SCRIPT) -> str:
    """One torchrun per node, one process per GPU; a c10d rendezvous across nodes."""
    nodes, per_node = node_layout(candidate, cluster)
    rendezvous = (" --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29500"
                  if nodes > 1 else " --standalone")
    return f"torchrun --nnodes={nodes} --nproc-per-node={per_node}{rendezvous} {script}"


def per_process_host(host: HostReport, processes: int) -> HostReport:
    """The host plan of one of ``processes`` training processes sharing the node equally."""
    if processes == 1:
        return host
    share = host.spec.machine.shared_by(processes)
    given = host.spec.loader.num_workers   # per process, as each process's DataLoader takes it
    loader = host.spec.loader.model_copy(update={
        "num_workers": given if given is not None and given <= share.cpus else None})
    return host_estimate(host.spec.model_copy(update={"machine": share, "loader": loader}),
                         host.measurement)


def slurm_header(candidate: Candidate, cluster: ClusterSpec, host: HostReport | None,
                 script: str = SCRIPT) -> list[str]:
    """One task per node running torchrun; CPUs and memory for every process's workers."""
    nodes, per_node = node_layout(candidate, cluster)
    lines = ["#!/bin/bash", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gres=gpu:{per_node}"]
    if host is not None:
        share = per_process_host(host, per_node)
        cpus_per_process = int(share.sbatch[0].split("=", 1)[1])
        mem_per_cpu = share.sbatch[1].split("=", 1)[1]
        machine = host.spec.machine
        node_cpus = machine.cpus
        wanted = per_node * cpus_per_process
        if machine.detected:
            lines.append(f"# WARNING: sized on this machine ({machine.described()}), often a "
                         "login node: give the training node's --cpus and --ram (or "
                         "--mem-per-cpu)")
        lines += [f"#SBATCH --cpus-per-task={min(wanted, node_cpus)}",
                  f"#SBATCH --mem-per-cpu={mem_per_cpu}",
                  f"# {counted(share.num_workers, 'DataLoader worker')} per GPU "
                  f"process, {counted(per_node, 'process', 'processes')} per node sharing its "
                  f"{node_cpus} CPUs and RAM (host plan)"]
        if wanted > node_cpus:    # this machine's CPUs are no verdict on the training node
            verdict, holder = ("", "this machine") if machine.detected else ("DOES NOT FIT: ",
                                                                              "the node")
            lines.append(f"# {verdict}{counted(per_node, 'process', 'processes')} need "
                         f"{wanted} CPUs ({cpus_per_process} each, for their workers and for "
                         f"memory at {mem_per_cpu} per CPU); {holder} has {node_cpus}")
    lines += ["export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)",
              "srun " + torchrun_command(candidate, cluster, script)]
    return lines
