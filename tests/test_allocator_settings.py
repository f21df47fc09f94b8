"""PYTORCH_CUDA_ALLOC_CONF parsing and rounding, against CUDACachingAllocator.cpp's rules."""

import pytest

from memcalc.device.allocator_settings import ROUNDUP_INTERVALS, AllocatorSettings
from memcalc.errors import InputError

MiB = 1 << 20


def test_default_conf_rounds_to_512_bytes():
    settings = AllocatorSettings.from_conf(None)
    assert settings.is_default
    assert [settings.round_size(n) for n in (1, 512, 513, 3 * MiB + 1)] == [
        512, 512, 1024, 3 * MiB + 512]


def test_roundup_power2_divisions_rounds_to_the_next_division():
    settings = AllocatorSettings.from_conf("roundup_power2_divisions:4")
    # between 1 and 2 MiB, four divisions of 256 KiB: 1.3 MiB -> 1.5 MiB
    assert settings.round_size(int(1.3 * MiB)) == int(1.5 * MiB)
    # powers of two and exact divisions stay
    assert settings.round_size(4 * MiB) == 4 * MiB
    assert settings.round_size(5 * MiB) == 5 * MiB
    # 5.1 MiB lies between 4 and 8 MiB: steps of 1 MiB -> 6 MiB
    assert settings.round_size(int(5.1 * MiB)) == 6 * MiB
    # small requests (<= 512 B x divisions) keep 512 B rounding
    assert settings.round_size(1000) == 1024


def test_per_interval_divisions_cover_smaller_sizes_with_the_first_value():
    settings = AllocatorSettings.from_conf("roundup_power2_divisions:[256:4,512:2,>:1]")
    table = settings.roundup_power2_divisions
    assert len(table) == ROUNDUP_INTERVALS
    assert table[:8] == (4,) * 8 + () and table[8] == 4 and table[9] == 2
    assert set(table[10:]) == {1}


def test_expandable_segments_and_max_split_size():
    settings = AllocatorSettings.from_conf("expandable_segments:True,max_split_size_mb:256")
    assert settings.expandable_segments and settings.max_split_size_bytes == 256 * MiB
    assert settings.oversize(256 * MiB) and not settings.oversize(255 * MiB)


def test_options_the_model_ignores_are_kept_as_not_modelled():
    settings = AllocatorSettings.from_conf("garbage_collection_threshold:0.6,expandable_segments:False")
    assert settings.not_modelled == ("garbage_collection_threshold",)


@pytest.mark.parametrize("conf,message", [
    ("expandable_segments", "has no value"),
    ("expandable_segments:yes", "use True or False"),
    ("max_split_size_mb:-3", "positive whole number"),
    ("roundup_power2_divisions:3", "power of two"),
    ("roundup_power2_divisions:[300:4]", "power of two in MiB"),
])
def test_bad_settings_name_the_problem(conf, message):
    with pytest.raises(InputError, match=message):
        AllocatorSettings.from_conf(conf)
