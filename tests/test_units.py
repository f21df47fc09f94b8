import pytest

from memcalc.units import format_bytes, format_count, parse_size


def test_iec_formatting():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(-2**20) == "-1.00 MiB"


def test_parameter_counts():
    assert format_count(6_738_415_616) == "6.74 B"
    assert format_count(124_439_808) == "124.44 M"
    assert format_count(999) == "999"


@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * 2**30), ("24GB", 24 * 10**9), ("80 GB", 80 * 10**9), ("512MiB", 512 * 2**20),
    ("1.5TiB", int(1.5 * 2**40)), ("4096", 4096), ("2kb", 2000),
])
def test_sizes_binary_and_decimal(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, message", [
    ("24G", "unit 'g'"), ("GiB", "does not start with a number"), ("0GB", "must be positive"),
])
def test_bad_sizes_name_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        parse_size(text)
