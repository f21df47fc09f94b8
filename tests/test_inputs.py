"""Models called with several named inputs and models that compute their own loss."""

import pytest
import torch

import memcalc
from memcalc.errors import InputError, TraceError
from memcalc.model.inputs import InputTensor, ModelInputs, plain_call
from memcalc.trace.losses import model_loss

MASKED_LM = "tests.fixtures.models:masked_lm"
VOCAB, WIDTH, SEQ, BATCH = 500, 32, 64, 4


def test_named_inputs_are_input_bytes_of_their_shapes():
    report = memcalc.estimate(MASKED_LM, batch_size=BATCH, device="cpu",
                              inputs={"input_ids": ((SEQ,), "int64"),
                                      "attention_mask": ((SEQ,), "float32")})
    assert report.device.method == "traced"
    assert report.static.input_batch_bytes == BATCH * SEQ * (8 + 4)
    assert report.input.output_shape == (BATCH, SEQ, VOCAB)


def test_the_models_own_loss_replaces_the_target():
    """With labels and --loss model no target tensor is made: the input bytes are the ids and
    the labels, and the loss is the model's cross-entropy over B*S rows."""
    report = memcalc.estimate(MASKED_LM, (SEQ,), batch_size=BATCH, device="cpu",
                              input_dtype="int64", loss="model",
                              inputs={"labels": ((SEQ,), "int64")})
    assert report.device.method == "traced"
    assert report.device.breakdown.input_batch == 2 * BATCH * SEQ * 8


def test_a_second_positional_argument_can_be_named():
    report = memcalc.estimate("tests.fixtures.models:two_inputs", (32,), batch_size=BATCH,
                              device="cpu", inputs={"mask": ((64,), "float32")})
    assert report.device.method == "traced"
    assert report.static.input_batch_bytes == BATCH * (32 + 64) * 4


def test_a_forward_missing_an_input_is_an_error_naming_it_not_a_static_estimate():
    # it was "FIT UNKNOWN (STATIC): batch 23899 needs ...", exit 0, the TypeError in --details
    with pytest.raises(InputError, match=r"_TwoInputs.forward\(\) needs 'mask'.*--input mask="):
        memcalc.estimate("tests.fixtures.models:two_inputs", (32,), batch_size=BATCH,
                         device="cpu")


def test_an_input_forward_has_no_parameter_for_is_an_error_listing_its_parameters():
    with pytest.raises(InputError, match=r"unexpected keyword argument 'extra'.*x, mask"):
        memcalc.estimate("tests.fixtures.models:two_inputs", (32,), batch_size=BATCH,
                         device="cpu", inputs={"mask": ((64,), "float32"),
                                               "extra": ((3,), "float32")})


@pytest.mark.parametrize("output, expected", [
    (torch.tensor(2.0), 2.0),
    ({"loss": torch.tensor(3.0), "logits": torch.zeros(2, 3)}, 3.0),
    ({"loss_classifier": torch.tensor(1.0), "loss_box_reg": torch.tensor(0.5)}, 1.5),
])
def test_model_loss_reads_every_form(output, expected):
    assert model_loss(output).item() == pytest.approx(expected)


def test_model_loss_without_one_names_the_fix():
    with pytest.raises(TraceError, match=r"--input labels"):
        model_loss({"logits": torch.zeros(2, 3)})


def test_plain_call_puts_the_batch_axis_in_front():
    inputs = ModelInputs(InputTensor(None, (3, 8), torch.float32),
                         (InputTensor("mask", (8,), torch.bool),), (("flag", True),))
    call = plain_call(inputs, 5)
    assert call.args[0].shape == (5, 3, 8) and call.kwargs["mask"].shape == (5, 8)
    assert call.kwargs["flag"] is True and inputs.batch_bytes(5) == 5 * (24 * 4 + 8)
