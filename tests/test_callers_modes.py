"""The estimate is a function of its spec alone: the caller's torch modes neither change it
nor are changed by it (``_torch_internals.callers_torch_modes_set_aside``)."""

import contextlib

import pytest
import torch

import memcalc

KW = dict(model_args=dict(in_features=64, hidden=64, depth=1), device="cpu")


@contextlib.contextmanager
def _default_dtype(dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _default_device(device):
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


AMBIENT = {
    "no_grad": (torch.no_grad, lambda: not torch.is_grad_enabled()),
    "inference_mode": (torch.inference_mode, torch.is_inference_mode_enabled),
    "autocast": (lambda: torch.autocast("cpu", dtype=torch.bfloat16),
                 lambda: torch.is_autocast_enabled("cpu")),
    "with torch.device('meta')": (lambda: torch.device("meta"),
                                  lambda: torch.empty(1).device.type == "meta"),
    "set_default_device('meta')": (lambda: _default_device("meta"),
                                   lambda: torch.empty(1).device.type == "meta"),
    "default dtype float64": (lambda: _default_dtype(torch.float64),
                              lambda: torch.get_default_dtype() is torch.float64),
}


@pytest.fixture(scope="module")
def plain():
    return memcalc.estimate("mlp", (64,), **KW).device


@pytest.mark.parametrize("case", list(AMBIENT))
def test_the_callers_mode_changes_nothing_and_is_kept(plain, case):
    context, still_on = AMBIENT[case]
    with context():
        device = memcalc.estimate("mlp", (64,), **KW).device
        assert still_on()
    assert device.method == plain.method == "traced"
    assert device.peak_bytes == plain.peak_bytes
