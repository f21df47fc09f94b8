"""The README example regenerator: commands read across continuation lines, and the new
output's excerpt found by the old excerpt's first and last lines, digits aside."""

from benchmarks.readme_examples import _command, _excerpt, regenerate


def test_a_command_continues_over_backslashes():
    lines = ["$ memcalc estimate --model resnet50 \\", "      --gpu T4 --cpus 2", "out"]
    assert _command(lines) == ("memcalc estimate --model resnet50 --gpu T4 --cpus 2", 2)


def test_the_excerpt_is_found_by_its_first_and_last_lines_with_digits_masked():
    new = ["PLAN: DDP on 4 GPUs: batch 12/GPU", "╭─ a ─╮", "│ 1.50 GiB │", "╰─────╯",
           "╭─ Batch plan ─╮", "│ usable 22.79 GiB │", "│ line │", "╰─────╯", "tail"]
    old = ["╭─ Batch plan ─╮", "│ usable 14.00 GiB │", "╰─────╯"]
    assert _excerpt(old, new) == new[4:8]
    # two panels in the old excerpt end at the second closing line
    assert _excerpt(["╭─ a ─╮", "│ 2 GiB │", "╰─────╯", "╭─ Batch plan ─╮", "╰─────╯"],
                    new) == new[1:8]
    # a verdict whose own words changed is still found by the words before its colon
    assert _excerpt(["PLAN: FSDP on 8 GPUs: batch 1/GPU", "╭─ a ─╮", "╰─────╯"],
                    new) == new[:4]
    assert _excerpt(["╭─ Strategies ─╮", "╰─────╯"], new) is None


def test_blocks_without_a_memcalc_command_are_left_alone():
    text = "intro\n```\nplain block\n```\n```bash\nmemcalc models\n```\n"
    assert regenerate(text) == (text, [])
