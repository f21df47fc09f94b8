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


def test_an_explicit_layout_always_overrides_the_check():
    first = resolve_layout(_conv3d_net(), (834, 224, 834, 3), Layout.CHANNELS_FIRST)
    assert first.traced_sample_shape == (834, 224, 834, 3)
    last = resolve_layout(_conv3d_net(), (8, 8, 8, 5), Layout.CHANNELS_LAST)
    assert last.traced_sample_shape == (5, 8, 8, 8)


class _RawAudio(nn.Module):
    """wav2vec2's stem: (N, L) samples get their channel axis inside forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 10, stride=5)

    def forward(self, x):
        return self.conv(x[:, None])


class _SpaceToDepth(nn.Module):
    """TResNet's stem: 3 channels folded 4x4 into 48 before the first conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(48, 8, 3)

    def forward(self, x):
        n, c, h, w = x.shape
        x = x.view(n, c, h // 4, 4, w // 4, 4).permute(0, 3, 5, 1, 2, 4)
        return self.conv(x.reshape(n, c * 16, h // 4, w // 4))


@pytest.mark.parametrize("model, shape, reached", [(_RawAudio, (16000,), (1, 16000)),
                                                   (_SpaceToDepth, (3, 64, 64), (48, 16, 16))])
def test_the_check_reads_what_the_first_layer_really_receives(model, shape, reached):
    with torch.device("meta"):
        built = model()
    decision = resolve_layout(built, shape, Layout.AUTO)
    assert decision.traced_sample_shape == shape
    assert ",".join(map(str, reached)) in decision.explanation


def test_wrong_number_of_dims_is_an_error():
    with pytest.raises(LayoutError, match=r"has 3 dims .* takes samples of 4 dims"):
        resolve_layout(_conv3d_net(), (3, 224, 224), Layout.AUTO)


def test_linear_first_layer_checks_in_features():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1024, 10))
    assert resolve_layout(model, (1024,), Layout.AUTO).layout == "features-last"
    with pytest.raises(LayoutError, match=r"in_features=1024"):
        resolve_layout(model, (1000,), Layout.AUTO)


def test_a_model_that_folds_frames_and_needs_a_named_input_is_accepted():
    """The first registered layer (a Linear on the conditioning) is not the first to run, and
    the 2D stem takes frames: the probe runs the model on meta with its named input and
    accepts what the model accepts (it refused: the probe called it without the input)."""
    from memcalc.pipeline import estimate
    from memcalc.specs import TrainingSpec

    report = estimate(TrainingSpec(model="tests.fixtures.user_builders:frame_net",
                                   sample_shape=(4, 8, 32, 32), inputs={"context": ((16,), "float32")},
                                   loss="mse", device="cpu", batch_size=2))
    assert report.device.method == "traced"
    assert report.input.layout == "as given"
