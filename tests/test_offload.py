"""Activation offloading (save_on_cpu) in the trace: what leaves the device, what comes back."""

from tests.fixtures.cases import TINY_GPT2
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec


def test_offloaded_bytes_are_the_tensors_autograd_saves():
    spec = TrainingSpec(model="tests.fixtures.models:single_linear", sample_shape=(16,),
                        batch_size=4, loss="mse", device="cpu", offload_activations=True)
    device = estimate(spec).device
    # addmm saves its input (the weight is not needed: the input needs no gradient);
    # mse_loss saves the output and the target
    assert device.offloaded_bytes == 4 * 16 * 4 + 4 * 8 * 4 + 4 * 8 * 4


def test_offloading_moves_activations_off_the_device():
    spec = TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(128,), batch_size=8,
                        device="cpu")
    plain = estimate(spec).device
    offloaded = estimate(spec.with_changes(offload_activations=True)).device
    assert offloaded.breakdown.activations < plain.breakdown.activations / 4
    assert offloaded.offloaded_bytes >= plain.breakdown.activations   # every saved tensor copied
    assert offloaded.compute_peak_bytes < plain.compute_peak_bytes


def test_offloaded_activations_are_counted_in_host_ram():
    spec = TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(128,), batch_size=8,
                        offload_activations=True, machine={"cpus": 4, "ram_bytes": 16 << 30})
    report = estimate(spec)
    terms = {term.name: term.total_bytes for term in report.host.main_terms}
    assert terms["offloaded activations"] == report.device.offloaded_bytes > 0
