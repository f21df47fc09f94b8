import pytest

from memcalc.device.cuda_overheads import cublas_workspace_bytes
from memcalc.errors import InputError
from memcalc.device.gpus import find_gpu, gpu_catalog

# which compute capabilities each architecture has (CUDA programming guide, compute
# capabilities table): a row whose architecture and capability disagree is a typo
ARCHITECTURE_CAPABILITIES = {
    "volta": {(7, 0)}, "turing": {(7, 5)}, "ampere": {(8, 0), (8, 6)}, "ada": {(8, 9)},
    "hopper": {(9, 0)}, "blackwell": {(10, 0), (12, 0)},
}

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
    # NVIDIA (CUDA) compute capabilities only: Volta 7.0 ... Blackwell 10.0 (datacenter) and
    # 12.0 (GeForce/RTX); the CUDA-library rules keyed on them assume an NVIDIA card
    assert major in (7, 8, 9, 10, 12) and 0 <= minor <= 9
    assert (major, minor) in ARCHITECTURE_CAPABILITIES[gpu.architecture]
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
                                           ("h100", "H100-80GB or H100-PCIe"),
                                           ("gh200", "GH200-96GB or GH200-144GB"),
                                           ("GH 200", "GH200-96GB or GH200-144GB")])
def test_a_name_that_fits_several_cards_asks_which(text, choices):
    with pytest.raises(InputError, match=rf"GPU '{text}' is ambiguous: which one, {choices}\?"):
        find_gpu(text)


def test_unknown_gpu_lists_close_names():
    with pytest.raises(InputError, match=r"unknown GPU 'a10o'; did you mean"):
        find_gpu("a10o")
    with pytest.raises(InputError, match="known: T4"):
        find_gpu("zzz")


# Cards added from the vendor datasheets. Memory follows the catalog's convention, the total
# nvidia-smi prints (MiB, as printed on real hosts of that card), and the datasheet capacity
# is binary there ("80 GB" H100 = 80 GiB of HBM, of which nvidia-smi shows 81559 MiB); GDDR6
# cards with ECC on by default give 1/16 of it to the check bits.
# name, datasheet capacity (GB as GiB), nvidia-smi total (MiB), ECC taking 1/16
NEW_CARD_MEMORY = [
    ("A40", 48, 46068, True),
    ("A10G", 24, 23028, True),
    ("RTX-5090", 32, 32607, False),
    ("RTX-6000-Ada", 48, 49140, False),
    ("GH200-96GB", 96, 97871, False),
    ("GH200-144GB", 144, 146831, False),
    ("B200", 180, 183359, False),       # NVIDIA: 1,440 GB for 8 GPUs, not the 192 GB announced
]


@pytest.mark.parametrize("name, datasheet_gib, smi_mib, ecc", NEW_CARD_MEMORY,
                         ids=[row[0] for row in NEW_CARD_MEMORY])
def test_new_cards_hold_what_nvidia_smi_shows_of_the_datasheet_capacity(name, datasheet_gib,
                                                                        smi_mib, ecc):
    gpu = find_gpu(name)
    assert gpu.name == name
    assert gpu.memory_bytes == smi_mib * 1024 * 1024
    usable = datasheet_gib * 2**30 * (15 / 16 if ecc else 1)
    # the driver keeps back well under 1 % of what the datasheet lists
    assert 0.99 * usable <= gpu.memory_bytes <= usable


# name, fp32, tf32, bf16 (= fp16), GB/s, compute capability: dense peaks, derived here from
# the datasheet's own figures where it prints sparse or per-board ones
NEW_CARD_RATES = [
    ("A40", 37.4, 149.6 / 2, 299.4 / 2, 696, "8.6"),           # A40 datasheet, sparse / 2
    ("A10G", 35.0, 35.0, 70.0, 600, "8.6"),                    # no NVIDIA datasheet; see row
    ("RTX-5090", 104.8, 104.8, 419.0 / 2, 1792, "12.0"),       # RTX Blackwell whitepaper
    ("RTX-6000-Ada", 91.1, 364.2 / 2, 728.4 / 2, 960, "8.9"),  # Ada whitepaper, sparse / 2
    ("GH200-96GB", 67.0, 989.4 / 2, 1978.9 / 2, 4000, "9.0"),   # H100 SXM5 tensor cores
    ("GH200-144GB", 67.0, 989.4 / 2, 1978.9 / 2, 4900, "9.0"),
    ("B200", 600 / 8, 18_000 / 8 / 2, 36_000 / 8 / 2, 64_000 / 8, "10.0"),  # HGX B200, 8 GPUs
]


@pytest.mark.parametrize("name, fp32, tf32, bf16, bandwidth, capability", NEW_CARD_RATES,
                         ids=[row[0] for row in NEW_CARD_RATES])
def test_new_cards_carry_the_dense_datasheet_rates(name, fp32, tf32, bf16, bandwidth,
                                                   capability):
    gpu = find_gpu(name)
    # datasheets round to 0.1 TFLOP/s, so half a sparse figure may be 0.05 off the dense one
    assert gpu.fp32_tflops == pytest.approx(fp32, abs=0.1)
    assert gpu.tf32_tflops == pytest.approx(tf32, abs=0.1)
    assert gpu.bf16_tflops == pytest.approx(bf16, abs=0.1)
    assert gpu.fp16_tflops == gpu.bf16_tflops
    assert gpu.memory_bandwidth_gbps == bandwidth
    assert gpu.compute_capability == capability


@pytest.mark.parametrize("text, name", [
    ("A40", "A40"), ("a10g", "A10G"), ("A10", "A10"), ("b200", "B200"), ("HGX B200", "B200"),
    ("B200-SXM-180GB", "B200"), ("RTX 5090", "RTX-5090"), ("5090", "RTX-5090"),
    ("GeForce RTX 5090", "RTX-5090"), ("RTX 6000 Ada", "RTX-6000-Ada"),
    ("RTX 6000 Ada Generation", "RTX-6000-Ada"), ("rtx-a6000", "RTX-A6000"),
    ("GH200 480GB", "GH200-96GB"), ("GH200 120GB", "GH200-96GB"), ("gh200-96gb", "GH200-96GB"),
    ("GH200 144G HBM3e", "GH200-144GB"), ("gh200_144gb", "GH200-144GB"), ("h200", "H200"),
])
def test_new_names_and_nvidia_smi_names_find_one_card(text, name):
    assert find_gpu(text).name == name


@pytest.mark.parametrize("text", ["RTX 6000", "rtx6000", "6000"])
def test_a_family_name_with_other_cards_outside_the_catalog_is_not_guessed(text):
    # "RTX 6000" is also the 24 GB Turing Quadro RTX 6000: a name that only starts one
    # catalog name is offered, never taken
    with pytest.raises(InputError, match=rf"unknown GPU '{text}'; did you mean .*RTX-6000-Ada"):
        find_gpu(text)


def test_every_name_and_alias_finds_its_own_card():
    for gpu in gpu_catalog():
        for label in (gpu.name, *gpu.aliases):
            assert find_gpu(label).name == gpu.name, label


@pytest.mark.parametrize("name, workspace", [
    # CublasHandlePool.cpp: 32 MiB when the compute capability's major is 9, 10 or 12,
    # else 4096 KiB x 2 + 16 KiB x 8
    ("B200", 4096 * 8 * 1024), ("RTX-5090", 4096 * 8 * 1024), ("GH200-96GB", 4096 * 8 * 1024),
    ("GH200-144GB", 4096 * 8 * 1024), ("A40", 4096 * 1024 * 2 + 16 * 1024 * 8),
    ("A10G", 4096 * 1024 * 2 + 16 * 1024 * 8), ("RTX-6000-Ada", 4096 * 1024 * 2 + 16 * 1024 * 8),
])
def test_new_cards_get_pytorchs_cublas_workspace(name, workspace):
    assert cublas_workspace_bytes(find_gpu(name)) == workspace
