"""Ecosystem benchmark: does `memcalc estimate` trace the models users bring?

Builds every case in ``benchmarks/ecosystem_cases.py`` (torchvision classification, video,
segmentation and detection; timm; MONAI 3D; Hugging Face transformers — from code and small
configs, never weights) through the command line, one fresh process each, as a user would:
``memcalc estimate --model ... --batch-size 2 --json``. Each case is traced (``device.method``
is ``traced``), static (with the reason the report gives), a clean error (one ``Error:`` line,
non-zero exit) or a traceback (anything else: a crash, a timeout, output that is not JSON).

torchvision and timm on this package index ship only wheels built against CUDA torch, so the
benchmark runs in an environment of its own (not CI's), which runs on the CPU:

    python3 -m venv /tmp/tvenv && . /tmp/tvenv/bin/activate
    pip install torch==2.14.1 torchvision==0.29.1 && pip install timm monai transformers einops
    pip install -e .
    python -m benchmarks.ecosystem [--library timm] [--only vit] [--resume] [--compile]

Writes benchmarks/out/ecosystem.json (after every case) and benchmarks/results-ecosystem.md.
With ``--compile`` every case runs ``memcalc estimate --compile --device cpu`` (one trace:
whether a compiled step is captured does not depend on the target): a traced case is
``compiled`` when every compiled region was traced as Inductor runs it, ``partly eager`` when
one ran eagerly (a graph break, or compiled graphs memcalc could not run: the reason is its
cause); out/ecosystem-compile.json and results-ecosystem-compile.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from benchmarks.ecosystem_cases import LIBRARIES, cases

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240
TRACE_FAILED = "traced step: "


class Mode(NamedTuple):
    """How every case runs: memcalc's extra options, where results go, the categories."""

    options: tuple[str, ...]
    out: Path
    results: Path
    categories: tuple[str, ...]


MODES = {
    "eager": Mode((), ROOT / "benchmarks" / "out" / "ecosystem.json",
                  ROOT / "benchmarks" / "results-ecosystem.md",
                  ("traced", "static", "clean error", "traceback")),
    # compiled: one trace on the CPU target, as capturing is the same for any target and a
    # CUDA estimate without --gpu traces a batch search on five cards, capturing each time
    "compile": Mode(("--compile", "--device", "cpu"),
                    ROOT / "benchmarks" / "out" / "ecosystem-compile.json",
                    ROOT / "benchmarks" / "results-ecosystem-compile.md",
                    ("compiled", "partly eager", "static", "clean error", "traceback")),
}


def run_case(args: list[str], mode: Mode = MODES["eager"]) -> dict:
    """One fresh ``memcalc estimate`` process: its category, cause and seconds."""
    command = ["nice", "-n", "10", sys.executable, "-m", "memcalc", "estimate", *args,
               *mode.options, "--batch-size", "2", "--json"]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"category": "traceback", "cause": f"timed out after {TIMEOUT_S} s",
                "seconds": TIMEOUT_S}
    seconds = round(time.perf_counter() - start, 1)
    result = classify(done.returncode, done.stdout, done.stderr)
    if mode.options and result["category"] == "traced":
        fallbacks = result.pop("compile_fallbacks")
        result = {**result, "category": "partly eager" if fallbacks else "compiled",
                  "cause": fallbacks[0][:300] if fallbacks else ""}
    return {**result, "seconds": seconds}


def classify(code: int, stdout: str, stderr: str) -> dict:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if code != 0:
        clean = len([line for line in lines if line.startswith("Error:")]) == 1 and \
            "Traceback" not in stderr
        return {"category": "clean error" if clean else "traceback",
                "cause": (lines[-1] if lines else f"exit {code}")[:300]}
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError:
        return {"category": "traceback", "cause": "stdout is not the JSON report"}
    device = report["device"]
    result = {"peak_bytes": device["total_bytes"],
              "compile_fallbacks": device.get("compile_fallbacks") or [],
              "bounded_ops": sorted({use["op"] for use in device.get("bounded_sizes") or []})}
    if device["method"] == "traced":
        return {"category": "traced", "cause": "", **result}
    cause = next((line.removeprefix(TRACE_FAILED).split("; the device figure")[0]
                  for line in report["unsupported"] if line.startswith(TRACE_FAILED)), "?")
    return {"category": "static", "cause": cause[:300], **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", help="only this library (as in the table)")
    parser.add_argument("--only", help="only cases whose name contains this")
    parser.add_argument("--resume", action="store_true",
                        help="skip cases already measured with the same arguments")
    parser.add_argument("--compile", action="store_true",
                        help="every case with memcalc's --compile")
    options = parser.parse_args()
    mode = MODES["compile" if options.compile else "eager"]
    # earlier results are kept (and the table covers them); --resume skips them
    results = json.loads(mode.out.read_text()) if mode.out.exists() else {}
    mode.out.parent.mkdir(parents=True, exist_ok=True)
    every = cases()
    # cases no longer listed are forgotten; --resume measures again those whose arguments changed
    current = {f"{library}/{name}": args for library, name, args in every}
    results = {key: result for key, result in results.items()
               if current.get(key) == result["args"]}
    for library, name, args in every:
        key = f"{library}/{name}"
        if (options.library and library != options.library) or \
                (options.only and options.only not in name) or (options.resume and key in results):
            continue
        results[key] = {"library": library, "name": name, "args": args,
                        **run_case(args, mode)}
        print(f"{key:50s} {results[key]['category']:12s} {results[key]['seconds']:6.1f} s  "
              f"{results[key]['cause'][:80]}", flush=True)
        mode.out.write_text(json.dumps(results, indent=1))
    mode.results.write_text(markdown(results, mode))
    print(markdown(results, mode))


def markdown(results: dict, mode: Mode = MODES["eager"]) -> str:
    by_library: dict[str, list[dict]] = defaultdict(list)
    for result in results.values():
        by_library[result["library"]].append(result)
    rows = ["| library | cases | " + " | ".join(mode.categories) + " | median s |",
            "|---|---:|" + "---:|" * len(mode.categories) + "---:|"]
    ordered = sorted(by_library.items(), key=lambda item: LIBRARIES.index(item[0]))
    for library, group in [*ordered, ("all", list(results.values()))]:
        counts = [sum(r["category"] == c for r in group) for c in mode.categories]
        share = f" ({100 * counts[0] / len(group):.0f} %)" if group else ""
        rows.append(f"| {library} | {len(group)} | {counts[0]}{share} | "
                    + "".join(f"{count} | " for count in counts[1:])
                    + f"{statistics.median(r['seconds'] for r in group):.1f} |")
    causes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for result in results.values():
        if result["category"] != mode.categories[0]:
            causes[(result["category"], result["cause"])].append(
                f"{result['library']}/{result['name']}")
    listed = [f"- **{category}** ({len(names)}): {cause} — {', '.join(sorted(names))}"
              for (category, cause), names in sorted(causes.items())]
    bounded = sorted(f"{r['library']}/{r['name']}" for r in results.values()
                     if r.get("bounded_ops"))
    return "\n".join([
        "# Ecosystem: models users bring, through `memcalc estimate "
        + "".join(f"{option} " for option in mode.options) + "--batch-size 2 --json`",
        "", f"{datetime.date.today()}; {platform.machine()}, {os.cpu_count()} cores; "
        + ", ".join(f"{package} {_version(package)}" for package in
                    ("torch", "torchvision", "timm", "monai", "transformers")), "",
        *rows, "", f"Not {mode.categories[0]}, by cause:", "", *(listed or ["- none"]), "",
        f"Traced with data-dependent ops at bounds ({len(bounded)}): {', '.join(bounded)}", ""])


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
