"""The documentation example checker: commands read across continuation lines, the new
output's excerpt found by the old excerpt's first and last lines, digits aside; Python blocks
run; refusals shown by their Error: line."""

from benchmarks.doc_examples import (MEASURED, MEASURED_LINES_SLACK, _command, _excerpt,
                                     differences, regenerate)


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


def test_a_python_block_followed_by_a_text_block_is_run_and_its_output_compared():
    text = "```python\nprint(6 * 7)\n```\n\n```text\n41\n```\n"
    assert differences(text) == ["print(6 * 7): now '42'"]
    assert regenerate(text)[0] == text.replace("41", "42")


def test_a_refusal_shows_its_error_line():
    line = "Error: unknown model 'resnet5' (did you mean 'resnet50'?); zoo models: "
    text = "```\n$ memcalc estimate --model resnet5\n" + line + "{}\n```\n"
    assert differences(regenerate(text.format("x"))[0]) == []
    assert regenerate(text.format("x"))[0].count("(did you mean 'resnet50'?)") == 1


def test_a_measured_block_is_held_to_its_shape_not_its_words():
    text = "```python\nprint(6 * 7, 'GiB')\n```\n\n```text\n41 GiB\n```\n"
    assert differences(MEASURED + ": a test -->\n" + text) == []
    assert differences(text) == ["print(6 * 7, 'GiB'): now '42 GiB'"]
    extra = "".join(f"{line}\n" for line in range(MEASURED_LINES_SLACK + 1))
    longer = text.replace("41 GiB\n", "41 GiB\n" + extra)
    assert differences(MEASURED + ": a test -->\n" + longer)


def test_a_block_marked_not_run_is_skipped_whole():
    text = "<!-- not run: a test -->\n```\n$ memcalc calibrate\nmeasuring\n```\nafter\n```\n"
    assert regenerate(text) == (text, []) and differences(text) == []
