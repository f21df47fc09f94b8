from memcalc.units import format_bytes, format_count


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
