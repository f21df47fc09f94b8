"""The host side of a job's validation (``Report.validation_host``): the validation loader's
whole volumes, what the validation step keeps in host RAM (a sliding window aggregated on
the CPU), and the training loader's persistent workers alive beside it; ``check`` fails a
job whose validation does not fit in host RAM though training does."""

import math

import pytest

import memcalc
from memcalc.errors import MemoryBudgetError
from memcalc.host.arithmetic import FORK_WORKER_BYTES

NET = "tests.fixtures.ecosystem_models:voxel_mlp"
VOLUME = (1, 64, 64, 64)
WINDOW = dict(roi=(32, 32, 32), sw_batch_size=2, output_device="cpu")
MACHINE = {"cpus": 2, "ram_bytes": 64 << 30}


def _job(**options):
    options = {"machine": MACHINE, **options}
    return memcalc.estimate(NET, (1, 32, 32, 32), batch_size=2, loss="sum",
                            eval_sample_shape=VOLUME, sliding_window=WINDOW,
                            model_args={"out_channels": 4}, **options)


def test_the_validation_loader_carries_whole_volumes_at_the_validation_batch():
    report = _job(eval_batch_size=3, loader={"num_workers": 1})
    host = report.validation_host
    assert host.sample_bytes == math.prod(VOLUME) * 4
    assert host.batch_bytes == 3 * host.sample_bytes
    assert report.host.sample_bytes == 32 ** 3 * 4          # training's own, untouched


def test_what_the_validation_step_keeps_on_the_cpu_is_a_main_process_term():
    report = _job(loader={"num_workers": 1})
    kept = report.validation.host_tensor_bytes
    assert kept >= (4 + 1) * math.prod(VOLUME[1:]) * 4       # output and count map, float32
    terms = {term.name: term for term in report.validation_host.main_terms}
    assert terms["step's tensors on the CPU"].total_bytes == kept
    assert "step's tensors on the CPU" not in {term.name for term in report.host.main_terms}


def test_the_training_loaders_persistent_workers_stay_alive_during_validation():
    def idle(persistent: bool) -> int:
        loader = {"num_workers": 2, "persistent_workers": persistent}
        terms = {t.name: t for t in _job(loader=loader).validation_host.main_terms}
        term = terms.get("training loader's workers")
        return term.total_bytes if term else 0
    assert idle(persistent=False) == 0
    assert idle(persistent=True) == 2 * FORK_WORKER_BYTES     # forked workers, no dataset


def test_check_fails_a_job_whose_validation_does_not_fit_in_host_ram():
    args = dict(gpu_memory_bytes=8 << 30, loader={"num_workers": 0})
    roomy = _job(**args)
    # room for training's host peak, not for validation's
    ram = (roomy.host.peak_bytes + roomy.validation_host.peak_bytes) // 2
    machine = {"cpus": 2, "ram_bytes": int(ram / (1 - 0.05))}
    with pytest.raises(MemoryBudgetError, match="validation needs .* of host RAM") as caught:
        memcalc.check(NET, (1, 32, 32, 32), batch_size=2, loss="sum", machine=machine,
                      eval_sample_shape=VOLUME, sliding_window=WINDOW,
                      model_args={"out_channels": 4}, **args)
    report = caught.value.report
    assert report.host.fits and not report.validation_host.fits
