"""The host panel's sample line: the model input and the sample's other tensors apart."""

from memcalc.host import HostSpec, host_estimate
from memcalc.host.specs import MachineSpec
from memcalc.render.host import sample_text

MIB = 1 << 20


def _host(sample_bytes: int | None = None):
    spec = HostSpec(sample_shape=(1, 128, 128, 128), batch_size=2, cuda=False,
                    machine=MachineSpec(cpus=4, ram_bytes=16 << 30))
    host = host_estimate(spec)
    return host if sample_bytes is None else host.model_copy(update={"sample_bytes": sample_bytes})


def test_a_sample_from_its_shape_is_its_model_input():
    host = _host()
    assert host.sample_bytes == 8 * MIB
    assert sample_text(host) == "1×128×128×128 float32 = 8.00 MiB"


def test_a_measured_samples_label_is_not_folded_into_the_images_size():
    # an 8 MiB float32 volume and its int64 mask of the same shape: 24 MiB in all
    text = sample_text(_host(24 * MIB))
    assert text == ("1×128×128×128 float32 8.00 MiB + 16.00 MiB of its other tensors "
                    "(labels, masks) = 24.00 MiB")


def _verify(predicted: int):
    from memcalc.host.report import VerifyReport

    return VerifyReport(num_workers=2, prefetch_factor=2, pin_memory=False, batches_planned=8,
                        batches=8, seconds=3.0, measured_peak_bytes=predicted + MIB,
                        measured_by="memory cgroup (v2)", predicted_peak_bytes=predicted,
                        cap_bytes=4 << 30, held=True, oom_killed=False)


def test_the_verify_line_names_the_plans_peak_where_its_own_prediction_differs():
    from memcalc.render.host import verify_line

    line = verify_line(_verify(512 * MIB), headline_bytes=3 << 30)
    assert ("vs 512.00 MiB predicted for the loader as run here (the plan's 3.00 GiB adds the "
            "model, the step and CUDA)") in line
    same = verify_line(_verify(512 * MIB), headline_bytes=512 * MIB)
    assert "vs 512.00 MiB predicted (" in same and "as run here" not in same


def test_a_share_of_the_node_says_whose_limit_and_request_it_is():
    from rich.console import Console

    from memcalc.render.host import host_renderable

    def shown(machine: MachineSpec) -> str:
        spec = HostSpec(sample_shape=(3, 64, 64), batch_size=2, machine=machine)
        console = Console(width=200, record=True)
        console.print(host_renderable(host_estimate(spec), details=False))
        return console.export_text()

    node = MachineSpec(cpus=32, ram_bytes=256 << 30)
    share = shown(node.shared_by(8))
    assert "limit 32.00 GiB (1/8 of the node" in share and "8 × the CPUs" in share
    assert "of the node" not in shown(node)
