"""The largest ``sw_batch_size`` that fits (``memcalc.device.window_search``): the search
against a closed-form memory curve, the window count against MONAI's own slicing, and the
answer against estimates traced at the sizes either side of it."""

from types import SimpleNamespace

import pytest

import memcalc
from memcalc.device.window_search import MAX_WINDOW_TRACES, plan_sw_batch
from memcalc.eval_specs import SlidingWindowSpec
from memcalc.model.sliding_window import windows_per_volume


def _curve(limit: int, calls: list[int]):
    """A step of 1 GiB plus 1 GiB per window that fits in ``limit`` GiB."""
    def report_at(size: int):
        calls.append(size)
        total = (1 + size) << 30
        return SimpleNamespace(total_bytes=total, fits=total <= limit << 30)
    return report_at


@pytest.mark.parametrize("start", [1, 3, 8, 40])
@pytest.mark.parametrize("limit", [1, 2, 7, 20, 64, 500])
def test_the_search_finds_the_largest_size_that_fits(limit, start):
    calls: list[int] = []
    plan = plan_sw_batch(_curve(limit, calls), windows=125, start=start)
    assert plan.max_sw_batch_size == min(max(limit - 1, 0), 125)
    assert len(calls) == len(set(calls)) <= MAX_WINDOW_TRACES
    assert [p.sw_batch_size for p in plan.points] == sorted(calls)


@pytest.mark.parametrize("volume,roi,overlap", [
    ((512, 512, 512), (128, 128, 128), 0.25), ((384, 200, 96), (128, 128, 128), 0.5),
    ((64, 48, 80), (32, 32, 32), 0.0), ((100, 100), (128, 64), 0.25)])
def test_the_window_count_is_monais(volume, roi, overlap):
    from monai.data.utils import dense_patch_slices
    from monai.inferers.utils import _get_scan_interval

    padded = tuple(max(size, window) for size, window in zip(volume, roi))
    interval = _get_scan_interval(padded, roi, len(roi), (overlap,) * len(roi))
    monai = len(dense_patch_slices(padded, roi, interval))
    spec = SlidingWindowSpec(roi=roi, overlap=overlap)
    assert windows_per_volume(spec, volume) == monai


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_the_largest_window_batch_fits_and_the_next_one_up_does_not():
    net = "tests.fixtures.ecosystem_models:voxel_mlp"
    args = dict(batch_size=1, phase="eval", loss="sum", gpu_memory_bytes=int(1.1 * (1 << 30)),
                model_args={"hidden": 256})

    def device(sw_batch_size: int):
        return memcalc.estimate(net, (1, 64, 64, 64), **args, sliding_window=dict(
            roi=(32, 32, 32), sw_batch_size=sw_batch_size)).device
    plan = device(1).window_plan
    assert plan.windows == 3 ** 3 and 1 <= plan.max_sw_batch_size < plan.windows
    assert device(plan.max_sw_batch_size).fits
    assert not device(plan.max_sw_batch_size + 1).fits
