"""The op names a report reads are ATen's own, as a trace lists them."""

from __future__ import annotations

import pytest
import torch

from memcalc.api import training_spec
from memcalc.pipeline import _prepare
from memcalc.trace.reported_ops import CONV_OPS, CUBLAS_OPS, REPORTED_OPS, reported_ops


@pytest.mark.parametrize("name", sorted(REPORTED_OPS))
def test_every_reported_name_is_an_aten_op(name):
    assert hasattr(torch.ops.aten, name)


def test_a_traced_conv_and_linear_step_names_what_the_report_reads():
    spec = training_spec("tests.fixtures.compiled_models:conv_bn_relu", (3, 16, 16),
                         model_args={"channels": 8, "depth": 2, "size": 16})
    names = _prepare(spec, None)._trace(2, real=True).op_names
    kept = reported_ops(names)
    assert kept & CONV_OPS and kept & CUBLAS_OPS      # its convolutions and its classifier
    assert kept < names and kept <= REPORTED_OPS
