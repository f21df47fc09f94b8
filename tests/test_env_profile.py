"""Which environment profile an estimate uses, and what a bad profile file gets."""

import pytest

from memcalc.device.env_profile import (
    PROFILE_VARIABLE,
    LibraryFloor,
    builtin_names,
    builtin_profile,
    default_profile_path,
    load_profile,
    resolve_profile,
    save_profile,
)
from memcalc.errors import InputError
from memcalc.device.gpus import find_gpu

H100 = "h100-torch2.11-cu130"


@pytest.fixture
def clean_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(PROFILE_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def _renamed(name: str):
    return builtin_profile(f"{H100}.json").model_copy(update={"name": name})


def test_built_in_profile_follows_the_architecture(clean_environment):
    assert resolve_profile(None, find_gpu("H100-80GB")).name == H100
    assert resolve_profile(None, find_gpu("A100-80GB")).name == "generic"
    assert resolve_profile(None, None).name == "generic"
    assert {H100, "generic"} <= set(builtin_names())


def test_order_explicit_then_variable_then_default_location(clean_environment, monkeypatch):
    tmp = clean_environment
    save_profile(_renamed("default-location"), default_profile_path())
    assert default_profile_path() == tmp / "config" / "memcalc" / "env-profile.json"
    assert resolve_profile(None, None).name == "default-location"
    monkeypatch.setenv(PROFILE_VARIABLE, str(save_profile(_renamed("variable"), tmp / "v.json")))
    assert resolve_profile(None, None).name == "variable"
    explicit = save_profile(_renamed("explicit"), tmp / "e.json")
    assert resolve_profile(str(explicit), None).name == "explicit"
    assert resolve_profile(H100, None).name == H100   # a built-in by name


def test_round_trip_keeps_every_field(tmp_path):
    profile = builtin_profile(f"{H100}.json")
    assert load_profile(save_profile(profile, tmp_path / "p.json")) == profile


@pytest.mark.parametrize("content,message", [
    (None, "does not exist; write one with `memcalc calibrate`"),
    ("{not json", "is not a memcalc profile"),
    ('{"name": "x"}', "is not a memcalc profile"),
])
def test_a_missing_or_broken_file_is_one_input_error(tmp_path, content, message):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError, match=message):
        load_profile(path)


def test_floor_adds_each_library_once():
    floor = LibraryFloor(context_bytes=500, cublas_bytes=200, cudnn_bytes=100,
                         cudnn_after_cublas_bytes=20)
    assert [floor.outside_bytes(m, c) for m, c in ((0, 0), (1, 0), (0, 1), (1, 1))] == [
        500, 700, 600, 720]
