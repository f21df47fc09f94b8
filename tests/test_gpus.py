import pytest

from memcalc.errors import InputError
from memcalc.device.gpus import find_gpu, gpu_catalog

REQUIRED = ["T4", "V100-16GB", "V100-32GB", "RTX-3090", "RTX-4090", "RTX-A6000", "L4", "L40S",
            "A100-40GB", "A100-80GB", "H100-80GB", "H200"]


def test_catalog_has_the_common_training_cards():
    names = [gpu.name for gpu in gpu_catalog()]
    assert set(REQUIRED) <= set(names)
    assert len(names) == len(set(names))


@pytest.mark.parametrize("gpu", gpu_catalog(), ids=lambda gpu: gpu.name)
def test_rows_are_consistent(gpu):
    assert gpu.memory_bytes == gpu.memory_mib * 2**20
    major, minor = gpu.compute_capability_tuple
    assert 7 <= major <= 9 and 0 <= minor <= 9
    # tensor cores are never slower than the plain fp32 units on the same card
    for rate in (gpu.tf32_tflops, gpu.bf16_tflops, gpu.fp16_tflops):
        assert rate is None or rate >= gpu.fp32_tflops
    assert gpu.source


@pytest.mark.parametrize("text, name", [("h100 sxm", "H100-80GB"), ("RTX 4090", "RTX-4090"),
                                        ("a100_80gb", "A100-80GB"), ("3090", "RTX-3090")])
def test_lookup_ignores_case_and_separators(text, name):
    assert find_gpu(text).name == name


@pytest.mark.parametrize("text, choices", [("a100", "A100-40GB or A100-80GB"),
                                           ("V100", "V100-16GB or V100-32GB"),
                                           ("h100", "H100-80GB or H100-PCIe")])
def test_a_name_that_fits_several_cards_asks_which(text, choices):
    with pytest.raises(InputError, match=rf"GPU '{text}' is ambiguous: which one, {choices}\?"):
        find_gpu(text)


def test_unknown_gpu_lists_close_names():
    with pytest.raises(InputError, match=r"unknown GPU 'a10o'; did you mean"):
        find_gpu("a10o")
    with pytest.raises(InputError, match="known: T4"):
        find_gpu("zzz")
