"""The README and the documentation site say what the tool does today: the README stays short,
every command shown parses with the current options, every job file shown is a valid spec,
every link leads to a file, and every example's output is the tool's current output (slow:
each command is run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from benchmarks.doc_examples import ROOT, differences, pages
from memcalc.cli.commands import main
from memcalc.cli.job_file import read_job_file
from memcalc.specs import TrainingSpec

README_MAX_LINES = 200
_FENCED = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
_LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")


def _blocks(kind: str) -> list[tuple[Path, str]]:
    return [(page, body) for page in pages() for lang, body in _FENCED.findall(page.read_text())
            if lang == kind]


def _command_lines(body: str) -> list[str]:
    """The ``memcalc …`` command lines of a block, continuations joined, comments dropped."""
    joined = body.replace("\\\n", " ")
    return [line.removeprefix("$ ") for line in joined.splitlines()
            if line.removeprefix("$ ").startswith("memcalc ")]


def _shown_commands() -> list[str]:
    return sorted({command for _, body in _blocks("bash") + _blocks("")
                   if "Error:" not in body for command in _command_lines(body)})


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("command", _shown_commands())
def test_every_command_shown_parses_with_the_current_options(command):
    args = shlex.split(command, comments=True)[1:]
    with main.make_context("memcalc", []) as context:
        sub = main.get_command(context, args[0])
        assert sub is not None, args[0]
        sub.make_context(args[0], args[1:], parent=context).close()


def test_the_commands_are_shown_at_all():
    shown = {command.split()[1] for command in _shown_commands()}
    assert {"estimate", "check", "plan", "host", "feed", "calibrate", "models", "gpus"} <= shown


@pytest.mark.parametrize("page, body", _blocks("toml"),
                         ids=lambda value: getattr(value, "name", ""))
def test_every_job_file_shown_is_a_valid_spec(page, body, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(body)
    spec = TrainingSpec(**read_job_file(str(path)))
    assert spec.model and spec.batch_size


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(page):
    for target in _LINK.findall(page.read_text()):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_the_option_notes_name_only_options_the_commands_have():
    options = {opt for command in main.commands.values() for param in command.params
               for opt in getattr(param, "opts", []) + getattr(param, "secondary_opts", [])}
    options |= {opt for param in main.params for opt in param.opts}
    notes = (ROOT / "docs" / "reference" / "options.md").read_text()
    named = set(re.findall(r"^\| `(--[a-z0-9-]+)", notes, re.M))
    assert named and named <= options, named - options


@pytest.mark.slow
@pytest.mark.parametrize("page", [page for page in pages() if "```" in page.read_text()],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_every_example_shows_the_current_output(page):
    assert differences(page.read_text()) == []
