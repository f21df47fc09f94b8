"""Single-GPU and distributed candidates: with offloaded activations the batch is capped by
the host RAM the loader and the pinned activations share, and the pinned bytes a candidate
names are those of the batch it uses (not of the batch the GPU alone would allow)."""

import re

import pytest

from memcalc import api
from memcalc.host.workers import host_estimate
from memcalc.specs import TrainingSpec
from memcalc.strategies import ClusterSpec
from memcalc.units import parse_size

SPEC = TrainingSpec(model="mlp", model_args={"in_features": 4096, "hidden": 4096},
                    sample_shape=(4096,), gpu="T4", machine={"cpus": 2, "ram_bytes": 9 << 30})


@pytest.fixture(scope="module")
def offload_row():
    plan = api.plan_spec(SPEC, ClusterSpec())
    return next(c for c in plan.candidates if c.label == "mixed-precision+offload")


def test_the_host_cap_and_the_pinned_note_agree(offload_row):
    notes = " ".join(offload_row.notes)
    cap = int(re.search(r"batch limited to (\d+) by host RAM", notes)[1])
    pinned = parse_size(re.search(r"needs ([\d.]+ [KMGT]?i?B) of pinned host RAM", notes)[1]
                        .replace(" ", ""))
    assert offload_row.max_batch_size == cap > 0
    # the offloaded bytes are affine in the batch (bf16 weight copies are saved too): the
    # note is within 1 % of the line through traced batches 1 and 2 at the cap
    one, two = (api.estimate_spec(SPEC.with_changes(precision="bf16-mixed", batch_size=b,
                                                    offload_activations=True))
                for b in (1, 2))
    per_sample = two.device.offloaded_bytes - one.device.offloaded_bytes
    fixed = one.device.offloaded_bytes - per_sample
    assert pinned == pytest.approx(fixed + per_sample * cap, rel=0.01)
    # the host plan holds the loader's batches and those pinned bytes at the cap (the note's
    # bytes are rounded to 0.01 of their unit), and not 1 % more
    spec, rounding = one.host.spec, 0.005 * (1 << 30)

    def fits(batch, offloaded):
        return host_estimate(spec.model_copy(update={
            "batch_size": batch, "offloaded_activation_bytes": int(offloaded)})).fits
    assert fits(cap, pinned - rounding)
    assert not fits(int(cap * 1.01) + 1, (pinned + rounding) * 1.01)


@pytest.mark.parametrize("global_batch, micro, ranks", [
    (256, 60, 4), (256, 64, 4), (1000, 37, 8), (96, 200, 8), (7, 3, 1)])
def test_a_global_batch_is_made_exactly_with_the_fewest_accumulation_steps(global_batch, micro,
                                                                             ranks):
    # it was only a minimum: 256 on 4 GPUs at micro 60 gave 2 x 60 x 4 = 480
    from memcalc.strategies.candidates import accumulation

    made = accumulation(global_batch, micro, ranks)
    assert made.micro * made.steps * ranks == made.global_batch == global_batch
    assert made.micro <= micro
    fewer = [steps for steps in range(1, made.steps)
             if global_batch % (steps * ranks) == 0 and global_batch // (steps * ranks) <= micro]
    assert not fewer


def test_a_global_batch_the_ranks_cannot_split_evenly_is_stated():
    from memcalc.strategies.candidates import accumulation, global_batch_note

    made = accumulation(250, 60, 4)
    assert made.global_batch > 250 and made.micro == 60
    assert global_batch_note(made, 250, 4) == [
        f"global batch {made.global_batch}, not the 250 asked: 4 data-parallel ranks do not "
        "divide it into equal micro-batches"]
    assert global_batch_note(accumulation(256, 60, 4), 256, 4) == []
