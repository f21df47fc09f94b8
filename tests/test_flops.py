"""FLOPs of a training step against closed forms for linear and conv layers."""

from dataclasses import replace

from memcalc.pipeline import _prepare, training_flops
from memcalc.specs import TrainingSpec


def test_mlp_flops_are_three_forwards_minus_the_first_input_gradient():
    spec = TrainingSpec(model="mlp", model_args=dict(in_features=256, hidden=1024, depth=2),
                        sample_shape=(256,), device="cpu")
    batch = 4
    layers = [(256, 1024), (1024, 1024), (1024, 10)]
    forward = sum(2 * batch * fan_in * fan_out for fan_in, fan_out in layers)
    first_input_gradient = 2 * batch * 256 * 1024    # the input needs no gradient
    assert training_flops(spec, batch) == 3 * forward - first_input_gradient


def test_conv_flops_follow_output_voxels_times_kernel():
    spec = TrainingSpec(model="tests.models_for_tests:single_conv3d", sample_shape=(2, 8, 8, 8),
                        device="cpu", loss="sum")
    out_voxels = 8 * 8 * 8                      # 3x3x3, padding 1, stride 1
    forward = 2 * 2 * 4 * 27 * out_voxels       # 2 in, 4 out channels
    assert training_flops(spec, 1) == forward * 2   # + weight gradient (input needs none)


def test_checkpointing_adds_the_recomputed_forward_of_the_blocks():
    spec = TrainingSpec(model="gpt2", model_args=dict(vocab=1000, n_positions=64, dim=64,
                                                      depth=2, heads=4),
                        sample_shape=(64,), device="cpu")
    plain = training_flops(spec)
    checkpointed = training_flops(spec.with_changes(activation_checkpointing=True))
    prepared, _, _ = _prepare(spec, None)
    assert plain < checkpointed < plain * 4 / 3 + 1     # blocks only, not the LM head
    assert replace(prepared.setup).checkpoint_blocks == ()
