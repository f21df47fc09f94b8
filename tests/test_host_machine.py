"""Machine limits: given figures, SLURM's per-CPU memory, cgroup v1/v2 files."""

import os

import pytest

from memcalc.errors import InputError
from memcalc.host.machine import detect_machine, machine_from_options
from memcalc.host.specs import MachineSpec

GIB = 1 << 30


def fake_root(tmp_path, cgroup_line: str, files: dict[str, str]) -> str:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup_line + "\n")
    (tmp_path / "proc/meminfo").write_text("MemTotal:       65536000 kB\nMemFree: 1 kB\n")
    for path, text in files.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(tmp_path)


def test_cgroup_v2_memory_and_cpu_limits(tmp_path):
    root = fake_root(tmp_path, "0::/slurm/job_42", {
        "sys/fs/cgroup/slurm/job_42/memory.max": str(20 * GIB),
        "sys/fs/cgroup/slurm/job_42/cpu.max": "400000 100000"})
    machine = detect_machine(root)
    assert machine.ram_bytes == 20 * GIB and "cgroup" in machine.source
    assert machine.cpus == min(4, os.cpu_count())


def test_cgroup_v1_limits_and_unlimited_values(tmp_path):
    root = fake_root(tmp_path, "5:memory:/job\n4:cpu,cpuacct:/job", {
        "sys/fs/cgroup/memory/job/memory.limit_in_bytes": str(8 * GIB),
        "sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us": "-1",
        "sys/fs/cgroup/cpu/job/cpu.cfs_quota_us": "-1"})
    machine = detect_machine(root)
    assert machine.ram_bytes == 8 * GIB
    assert machine.cpus == os.cpu_count()
    unlimited = fake_root(tmp_path / "u", "5:memory:/", {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"})
    assert detect_machine(unlimited).ram_bytes == 65536000 * 1024   # MemTotal


def test_this_machine_uses_cpu_affinity():
    machine = detect_machine()
    assert machine.cpus == len(os.sched_getaffinity(0))
    assert 0 < machine.ram_bytes


def test_mem_per_cpu_limits_the_job_like_slurm():
    machine = machine_from_options(8, None, 4 * GIB, None)
    assert machine.limit_bytes == 32 * GIB
    capped = MachineSpec(cpus=8, ram_bytes=16 * GIB, mem_per_cpu_bytes=4 * GIB)
    assert capped.limit_bytes == 16 * GIB


def test_given_ram_assumes_linux_default_shm():
    machine = machine_from_options(64, 188 * 10**9, None, None)
    assert machine.shm_bytes == 94 * 10**9 and machine.shm_assumed
    assert machine.ram_bytes == 188 * 10**9
    given = machine_from_options(64, 188 * 10**9, None, 8 * GIB)
    assert given.shm_bytes == 8 * GIB and not given.shm_assumed
    # an allocation's per-CPU limit says nothing about the node's tmpfs
    assert machine_from_options(8, None, 4 * GIB, None).shm_bytes is None


@pytest.mark.parametrize("options,message", [
    ((None, None, 4 * GIB, None), r"--mem-per-cpu needs --cpus"),
    ((4, -GIB, None, None), r"--ram must be positive"),
    ((0, GIB, None, None), r"--cpus must be positive"),
])
def test_bad_machine_options_name_the_problem(options, message):
    with pytest.raises(InputError, match=message):
        machine_from_options(*options)


def test_a_process_of_eight_on_a_node_has_an_eighth_of_it():
    node = MachineSpec(cpus=36, ram_bytes=512 * GIB, shm_bytes=64 * GIB)
    share = node.shared_by(8)
    assert (share.cpus, share.limit_bytes, share.shm_bytes) == (4, 64 * GIB, 8 * GIB)
    assert share.node_processes == 8 and "one of 8 training processes" in share.described()
    assert node.shared_by(1) is node
    # a SLURM allocation's per-CPU memory stays the cap of the share
    slurm = MachineSpec(cpus=32, ram_bytes=512 * GIB, mem_per_cpu_bytes=4 * GIB)
    assert slurm.shared_by(8).limit_bytes == 32 * 4 * GIB // 8
    assert MachineSpec(cpus=4, ram_bytes=GIB).shared_by(8).cpus == 1   # never none
