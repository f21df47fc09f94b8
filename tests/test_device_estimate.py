"""One device report (``memcalc.device.estimate``): what the step may use on a card."""

from memcalc.device.env_profile import resolve_profile
from memcalc.device.gpus import find_gpu
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec

MLP = TrainingSpec(model="mlp", model_args=dict(in_features=256, hidden=1024, depth=2),
                   sample_shape=(256,), gpu="H100-80GB", batch_size=16)


def test_the_usable_memory_leaves_out_what_the_driver_keeps_of_the_card():
    """The driver keeps part of the card's total (nvidia-smi) from every process (480 MiB on
    H100, measured as NVML's total minus what cudaMemGetInfo offers: tests/test_gpu_measured.py):
    a step whose total fits the capacity less the headroom but not less that reserve does not
    fit, and the usable memory every figure is compared with says so."""
    driver = resolve_profile(None, find_gpu("H100-80GB")).driver_reserved_bytes
    assert driver == 480 << 20
    total = estimate(MLP).device.total_bytes
    capacity = int((total + driver // 2) / (1 - MLP.headroom_fraction)) + 1
    device = estimate(MLP.with_changes(gpu_memory_bytes=capacity)).device
    assert device.total_bytes == total
    assert device.usable_bytes == capacity - int(capacity * MLP.headroom_fraction) - driver
    assert device.plan.usable_bytes == device.usable_bytes
    assert device.capacity_bytes - device.headroom_bytes > total > device.usable_bytes
    assert device.fits is False and device.plan.max_batch_size < MLP.batch_size
