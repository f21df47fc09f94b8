"""``--spec FILE``: a job's settings kept in a TOML or JSON file with the fields of a report's
``spec`` (``memcalc estimate … --json`` writes them; a whole report is read for its ``spec``).

Precedence, highest first: options given on the command line, the file, the options'
defaults (and the detected machine). Each command-line option names the spec field it sets
(``OPTION_FIELDS``), so an option given explicitly wins even when it equals its default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from pydantic import BaseModel, ValidationError

from memcalc.api_errors import argument_error
from memcalc.cli.option_fields import OPTION_FIELDS
from memcalc.errors import InputError

HOST_FIELDS = {"sample_shape", "batch_size", "loader", "machine"}


def read_job_file(path: str) -> dict[str, Any]:
    """The spec fields in ``path`` (``.toml`` or ``.json``; a whole report gives its spec)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"--spec {path}: cannot read it ({error.__class__.__name__}: "
                         f"{getattr(error, 'strerror', None) or error}); give a readable TOML "
                         "or JSON file") from None
    if file.suffix.lower() not in (".toml", ".json"):
        raise InputError(f"--spec {path}: name a .toml or .json file")
    try:
        data = _toml(text) if file.suffix.lower() == ".toml" else json.loads(text)
    except ValueError as error:
        raise InputError(f"--spec {path}: not valid {file.suffix[1:].upper()} ({error})") from None
    if isinstance(data, dict) and isinstance(data.get("spec"), dict):
        data = data["spec"]     # a whole report (``--json`` output)
    if not isinstance(data, dict):
        raise InputError(f"--spec {path}: the file must hold a table of spec fields "
                         "(as in the report's \"spec\")")
    return data


def _toml(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:     # Python 3.10
        import tomli as tomllib
    return tomllib.loads(text)


def explicit_options(ctx: click.Context) -> set[str]:
    """The options given on the command line (or by environment variable), not defaulted."""
    return {name for name in ctx.params
            if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE,
                                                  ParameterSource.ENVIRONMENT)}


SPEC_OPTION = click.option(
    "--spec", "spec_file", metavar="FILE",
    help="Job settings in a TOML or JSON file with the fields of a report's spec (a saved "
         "--json report works); options given here override it.")


def merged_spec(spec_type: type[BaseModel], from_options: BaseModel, file_fields: dict,
                explicit: set[str], path: str) -> BaseModel:
    """``file_fields`` over ``from_options``, then the explicitly given options over both."""
    options = from_options.model_dump(mode="json")
    merged = _overlay(options, file_fields)
    if isinstance(file_fields.get("machine"), dict):
        merged["machine"] = file_fields["machine"]     # a node as a whole, never half detected
    for name in explicit:
        field = OPTION_FIELDS.get(name)
        if field is not None and field.split(".")[0] in options:
            _set(merged, field, _get(options, field))
    try:
        return spec_type.model_validate(merged)
    except ValidationError as error:
        message = str(argument_error(error, (spec_type,))).replace("unknown argument",
                                                                   "unknown field")
        raise InputError(f"--spec {path}: {message}") from None


def host_fields(file_fields: dict) -> dict:
    """The host command's part of a training spec (a host report's spec passes whole)."""
    if "model" not in file_fields:
        return file_fields
    fields = {k: v for k, v in file_fields.items() if k in HOST_FIELDS and v is not None}
    if "device" in file_fields:
        fields["cuda"] = file_fields["device"] == "cuda"
    return fields


def _overlay(base: Any, top: Any) -> Any:
    if isinstance(base, dict) and isinstance(top, dict):
        return {**base, **{k: _overlay(base.get(k), v) for k, v in top.items()}}
    return top


def _get(data: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def _set(data: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(data.get(part), dict):
            data[part] = {}
        data = data[part]
    data[last] = value
