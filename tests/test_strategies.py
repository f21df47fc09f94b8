"""The strategy planner on the issue's cases and on a small model with several GPUs."""

import math
import subprocess
import sys

import pytest

from memcalc.api import plan_spec
from memcalc.model.source import resolve_model
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.strategies import ClusterSpec, Strategy
from memcalc.strategies.spatial import part_counts

MACHINE = {"cpus": 16, "ram_bytes": 256 << 30}


@pytest.fixture(scope="module")
def llama_plan():
    return plan_spec(TrainingSpec(model="llama_7b", gpu="A100-80GB", machine=MACHINE),
                     ClusterSpec())


def by_label(plan, label):
    return next(c for c in plan.candidates if c.label == label)


@pytest.mark.slow
def test_llama_7b_does_not_fit_one_80gb_gpu_in_fp32_adam(llama_plan):
    baseline = by_label(llama_plan, "baseline")
    assert not baseline.fits and baseline.per_gpu_peak_bytes > llama_plan.usable_bytes
    # fp32 Adam: 16 bytes per parameter (weight, gradient, two moments) alone exceed the card
    parameters = sum(p.numel() for p in resolve_model("llama_7b", {}).build_meta().parameters())
    assert baseline.per_gpu_peak_bytes >= 16 * parameters > llama_plan.usable_bytes
    for single in ("mixed-precision", "checkpointing", "mixed-precision+checkpointing"):
        assert not by_label(llama_plan, single).fits


@pytest.mark.slow
def test_llama_7b_gets_the_cheapest_strategy_that_fits(llama_plan):
    chosen = by_label(llama_plan, llama_plan.recommended)
    assert chosen.fits and chosen.gpus > 1
    assert chosen.strategy in (Strategy.FSDP, Strategy.PIPELINE, Strategy.ZERO2)
    assert chosen.per_gpu_peak_bytes <= llama_plan.usable_bytes
    fitting = [c for c in llama_plan.candidates if c.fits]
    assert chosen.gpus == min(c.gpus for c in fitting)
    assert "nothing fits on 1" in llama_plan.reason
    assert f"--nproc-per-node={chosen.gpus}" in llama_plan.torchrun
    assert f"#SBATCH --gres=gpu:{chosen.gpus}" in llama_plan.slurm
    # replicated states never fit, however many GPUs
    assert not by_label(llama_plan, "ddp").fits and not by_label(llama_plan, "zero1").fits


LEVERS = {"": {}, "mixed-precision": {"precision": "bf16-mixed"},
          "checkpointing": {"activation_checkpointing": True},
          "mixed-precision+checkpointing": {"precision": "bf16-mixed",
                                            "activation_checkpointing": True},
          "mixed-precision+offload": {"precision": "bf16-mixed", "offload_activations": True}}
"""The spec changes of each single-GPU variant, by its label."""
SEED = TrainingSpec(model="resnet3d", sample_shape=(834, 224, 834, 3), gpu="RTX-4090",
                    machine=MACHINE)


@pytest.mark.slow
def test_the_seed_volume_on_a_24gb_gpu_is_split_spatially_with_its_new_max_batch():
    plan = plan_spec(SEED, ClusterSpec())
    # one whole volume needs more than the card with every single-GPU lever
    assert all(c.per_gpu_peak_bytes > plan.usable_bytes for c in plan.candidates if c.gpus == 1)
    chosen = by_label(plan, plan.recommended)
    assert chosen.strategy is Strategy.SPATIAL and chosen.gpus == chosen.spatial_parts > 1
    assert chosen.method.startswith(f"traced slab (1/{chosen.spatial_parts}) of ")
    assert chosen.fits and chosen.max_batch_size >= 1 and chosen.global_batch_size >= 1
    assert chosen.per_gpu_peak_bytes <= plan.usable_bytes
    assert chosen.gpus == min(c.gpus for c in plan.candidates if c.fits)
    assert f"--nproc-per-node={chosen.gpus}" in plan.torchrun and "nothing fits on 1" in plan.reason
    assert any(f"init_device_mesh('cuda', (1, {chosen.spatial_parts})" in n for n in chosen.notes)
    # the traced slab of its GPU count runs its batch on the card, half as many GPUs do not
    # run one sample (each replayed at the card's capacity, as the plan decides)
    base = chosen.label.partition(" + ")[2]
    lever = SEED.with_changes(**LEVERS[base])
    parts = chosen.spatial_parts
    fitting = lever.with_changes(spatial_parts=parts, batch_size=chosen.max_batch_size)
    assert estimate(fitting).device.fits
    fewer = lever.with_changes(spatial_parts=parts // 2, batch_size=1)
    assert estimate(fewer).device.fits is False
    # the other bases' slabs are not traced past the GPUs of the chosen one, and say so
    skipped = [note for note in plan.assumptions if note.startswith("not traced: spatial")]
    assert skipped and all(f"cannot rank above {chosen.label}" in note for note in skipped)


@pytest.mark.parametrize("cluster, axis_length, expected", [
    (ClusterSpec(), 834, [2 ** k for k in range(1, 10)]),          # up to max_gpus=512
    (ClusterSpec(max_gpus=16), 834, [2, 4, 8, 16]),
    (ClusterSpec(max_gpus=16), 5, [2, 4]),                          # no more parts than rows
    (ClusterSpec(gpus_per_node=8), 834, [2, 4, 8]),                 # divisors of the GPUs given
    (ClusterSpec(gpus_per_node=6), 834, [2]),
    (ClusterSpec(max_gpus=1), 834, []),
])
def test_spatial_part_counts_are_powers_of_two_within_the_gpus(cluster, axis_length, expected):
    assert part_counts(cluster, axis_length) == expected


@pytest.mark.slow
def test_the_seed_volume_on_one_gpu_only_gets_a_crop_that_fits():
    plan = plan_spec(SEED, ClusterSpec(max_gpus=1))
    assert {c.gpus for c in plan.candidates} == {1}
    assert plan.recommended is None and "crops" in plan.reason
    crop = plan.largest_sample_shape
    assert crop[-1] == 3 and all(c < s for c, s in zip(crop[:3], (834, 224, 834), strict=True))
    leanest = SEED.with_changes(sample_shape=crop, batch_size=1, gpu=None,
                                **LEVERS[plan.largest_sample_strategy])
    assert estimate(leanest).device.total_bytes <= plan.usable_bytes


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_data_parallel_on_the_gpus_given_with_accumulation_to_the_global_batch():
    spec = TrainingSpec(model="mlp", model_args=dict(in_features=1024, hidden=4096, depth=4),
                        sample_shape=(1024,), gpu="T4", machine=MACHINE)
    cluster = ClusterSpec(gpus_per_node=8, global_batch=1 << 20)
    plan = plan_spec(spec, cluster)
    chosen = by_label(plan, plan.recommended)
    assert chosen.gpus == 8 and chosen.fits
    assert chosen.accumulation_steps == math.ceil((1 << 20) / (chosen.max_batch_size * 8))
    ddp = by_label(plan, "ddp")
    baseline = by_label(plan, "baseline")
    assert ddp.max_batch_size <= baseline.max_batch_size    # buckets cost memory
    assert ddp.communication_s > 0 and baseline.communication_s == 0
    forced = plan_spec(spec, cluster.model_copy(update={"strategy": Strategy.ZERO2}))
    assert by_label(forced, forced.recommended).strategy is Strategy.ZERO2
    assert forced.reason.startswith("forced by --strategy zero2")


def test_the_planner_imports_neither_the_pipeline_nor_the_report_models():
    # the estimator is injected (memcalc.api), so the strategies sit below the pipeline
    code = ("import sys, memcalc.strategies, memcalc.strategies.rules; print(sorted(m for m in "
            "sys.modules if m.startswith(('memcalc.pipeline', 'memcalc.report', "
            "'memcalc.model.source'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def _tiny_job(width: int = 64, hidden: int = 256, **fields) -> TrainingSpec:
    return TrainingSpec(model="mlp", model_args={"in_features": width, "hidden": hidden,
                                                 "depth": 2},
                        sample_shape=(width,), gpu="T4", machine=MACHINE, **fields)


def test_compile_is_a_lever_only_when_asked_and_then_traced():
    labels = {c.label for c in plan_spec(_tiny_job(), ClusterSpec(max_gpus=1)).candidates}
    assert "compile" not in labels
    plan = plan_spec(_tiny_job(), ClusterSpec(max_gpus=1, compile_levers=True))
    compiled = by_label(plan, "compile")
    assert compiled.method == "traced" and by_label(plan, "mixed-precision+compile")
    assert any(note.startswith("compiled: memory as AOTAutograd's partition")
               for note in compiled.notes)


def test_a_compiled_job_names_the_levers_it_is_not_traced_with():
    plan = plan_spec(_tiny_job(compile=True), ClusterSpec(max_gpus=1))
    assert ("mixed-precision+offload not traced: --compile with --offload-activations is not "
            "traced together yet: leave one out") in plan.assumptions
    assert by_label(plan, "baseline").method == "traced"


def test_compile_is_not_traced_where_the_model_states_alone_exceed_the_gpu():
    # 8.4 M parameters with Adam: 134 MB of states on a 64 MiB "GPU"
    spec = _tiny_job(1024, 4096, gpu_memory_bytes=64 << 20)
    plan = plan_spec(spec, ClusterSpec(max_gpus=1, compile_levers=True))
    assert not any(c.label.endswith("compile") for c in plan.candidates)
    assert any(line.startswith("compile not traced: the model states alone need")
               for line in plan.assumptions)


@pytest.mark.parametrize("forced", [Strategy.FSDP, Strategy.MIXED_PRECISION])
def test_a_launch_file_for_a_forced_strategy_builds_only_that_strategys_rows(forced):
    """``plan --emit`` with ``--strategy``: the same recommendation and launch files as the
    whole plan, from the rows that strategy needs only (it built every strategy's rows)."""
    spec = TrainingSpec(model="mlp", model_args={"in_features": 64, "hidden": 128}, gpu="T4",
                        machine=MACHINE, sample_shape=(64,))
    whole = plan_spec(spec, ClusterSpec(gpus_per_node=4, strategy=forced, rank_traces=0))
    launch = plan_spec(spec, ClusterSpec(gpus_per_node=4, strategy=forced, rank_traces=0,
                                         launch_only=True))
    assert launch.recommended == whole.recommended and launch.recommended.startswith(forced.value)
    assert (launch.torchrun, launch.slurm, launch.train_script) == (
        whole.torchrun, whole.slurm, whole.train_script)
    distributed = forced is Strategy.FSDP
    needed = {Strategy.BASELINE, forced} | ({c.strategy for c in whole.candidates
                                             if c.gpus == 1 and c.strategy not in (
                                                 Strategy.COMPILE, Strategy.ACCUMULATION)}
                                            if distributed else set())
    assert {c.strategy for c in launch.candidates} == needed
    assert len(launch.candidates) < len(whole.candidates)
    assert any(line.startswith("launch file only") for line in launch.assumptions)
