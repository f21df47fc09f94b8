import pytest
import torch
from torch import nn

from memcalc.errors import LayoutError
from memcalc.model.layout import resolve_layout
from memcalc.specs import Layout


def _conv3d_net(channels=3):
    with torch.device("meta"):
        return nn.Sequential(nn.Conv3d(channels, 8, 3), nn.ReLU())


def test_channels_last_volume_is_detected_and_permuted():
    decision = resolve_layout(_conv3d_net(), (834, 224, 834, 3), Layout.AUTO)
    assert decision.layout == "channels-last"
    assert decision.traced_sample_shape == (3, 834, 224, 834)


def test_channels_first_kept_as_is():
    decision = resolve_layout(_conv3d_net(), (3, 16, 32, 32), Layout.AUTO)
    assert decision.layout == "channels-first"
    assert decision.traced_sample_shape == (3, 16, 32, 32)


def test_ambiguous_shape_defaults_to_channels_first_and_says_so():
    decision = resolve_layout(_conv3d_net(), (3, 8, 8, 3), Layout.AUTO)
    assert decision.layout == "channels-first"
    assert "both ends match" in decision.explanation
    forced = resolve_layout(_conv3d_net(), (3, 8, 8, 3), Layout.CHANNELS_LAST)
    assert forced.layout == "channels-last" and forced.traced_sample_shape == (3, 3, 8, 8)


def test_shape_that_fits_neither_layout_is_an_error():
    with pytest.raises(LayoutError, match=r"fits neither layout.*takes 3 channels"):
        resolve_layout(_conv3d_net(), (834, 224, 834, 5), Layout.AUTO)


def test_override_that_contradicts_the_shape_is_an_error():
    with pytest.raises(LayoutError, match=r"channels-first needs the first dim"):
        resolve_layout(_conv3d_net(), (834, 224, 834, 3), Layout.CHANNELS_FIRST)


def test_wrong_number_of_dims_is_an_error():
    with pytest.raises(LayoutError, match=r"has 3 dims .* takes samples of 4 dims"):
        resolve_layout(_conv3d_net(), (3, 224, 224), Layout.AUTO)


def test_linear_first_layer_checks_in_features():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1024, 10))
    assert resolve_layout(model, (1024,), Layout.AUTO).layout == "features-last"
    with pytest.raises(LayoutError, match=r"in_features=1024"):
        resolve_layout(model, (1000,), Layout.AUTO)
