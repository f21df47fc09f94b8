import pytest

import memcalc


def test_library_estimate_matches_the_spec_pipeline():
    report = memcalc.estimate("mlp", (64,), batch_size=3, optimizer="sgd", device="cpu",
                              model_args={"in_features": 64, "hidden": 32, "depth": 1})
    assert report.spec.batch_size == 3
    params = 64 * 32 + 32 + 32 * 10 + 10
    assert report.static.parameter_bytes == 4 * params
    assert report.static.optimizer_state_bytes == 0


def test_bad_spec_values_are_rejected_by_name():
    with pytest.raises(memcalc.InputError,
                       match=r"^sample_shape=\(0,\): sample shape dimensions must be positive"):
        memcalc.estimate("mlp", (0,))
    with pytest.raises(memcalc.InputError, match="unknown optimizer 'lamb'"):
        memcalc.estimate("mlp", optimizer="lamb")
