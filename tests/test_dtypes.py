"""The one dtype table against torch's own element sizes."""

import pytest
import torch

from memcalc.dtypes import DTYPES, INPUT_DTYPES, dtype_bytes, element_size


@pytest.mark.parametrize("name", list(DTYPES))
def test_sizes_are_torchs_element_sizes(name):
    expected = torch.empty((), dtype=getattr(torch, name)).element_size()
    assert dtype_bytes(name) == element_size(DTYPES[name]) == expected


def test_input_dtypes_are_in_the_table_and_unknown_names_are_refused():
    assert set(INPUT_DTYPES) <= set(DTYPES)
    with pytest.raises(ValueError, match="unknown dtype 'float8'; accepted: float32"):
        dtype_bytes("float8")
