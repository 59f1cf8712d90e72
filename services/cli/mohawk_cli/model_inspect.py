"""`mohawk model inspect FILE`: what a model file holds and how each backend would hold it.

FILE is a GGUF file or a safetensors model directory. The report (`model_report.py`) is made from
the file's config and tensor index alone, with the decisions the loader and the planner use; this
module only parses flags and prints it, as text or (`--json`) as one JSON object. A bad file, or
one Mohawk cannot run, ends as one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from mohawk_common.errors import MohawkError

if TYPE_CHECKING:
    from mohawk_cli.model_report import ModelReport

MIB = 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="model_command", required=True, metavar="{inspect}")
    inspect = commands.add_parser(
        "inspect", help="architecture, stored types, what runs natively where, and a stage's memory"
    )
    inspect.add_argument("file", help="a GGUF file or a safetensors model directory")
    inspect.add_argument(
        "--layers", type=int, help="the memory of stages of this many layers (default: all layers)"
    )
    inspect.add_argument(
        "--weights", default="native", help="weight mode: native (default), int4, bf16, fp32"
    )
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    from mohawk_cli.model_report import inspect_model  # the model store and shard formats: only here
    from mohawk_common.model_store import open_model

    try:
        report = inspect_model(open_model(args.file), weights=args.weights, stage_layers=args.layers)
    except MohawkError as exc:
        print(f"mohawk model inspect: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(as_json(report), indent=2) if args.json else "\n".join(render(report)))
    return 0


def as_json(report: ModelReport) -> dict[str, object]:
    data = dataclasses.asdict(report)
    for memory, stages in zip(data["memory"], report.memory, strict=True):
        for entry, stage in zip(memory["stages"], stages.stages, strict=True):
            entry["total"] = stage.total
    return data


def render(report: ModelReport) -> list[str]:
    """The report as lines of text."""
    tied = ", tied embedding" if report.tie_word_embeddings else ""
    lines = [
        f"{report.path}: {report.file_format}, {_mib(report.file_bytes)}",
        f"model    {report.model_id} ({report.architecture}): {report.num_layers} layers, "
        f"hidden {report.hidden_size}, {report.num_heads} heads ({report.num_kv_heads} KV) of "
        f"{report.head_dim}, MLP {report.intermediate_size}, vocab {report.vocab_size}{tied}",
    ]
    for i, stored in enumerate(report.stored):
        unit = "tensor " if stored.num_tensors == 1 else "tensors"
        lines.append(
            f"{'stored' if i == 0 else '':<8} {stored.format:<6} {stored.num_tensors:>5} {unit} "
            f"{_mib(stored.num_bytes):>12}"
        )
    lines += ["", f"held (--weights {report.weights}):"]
    for backend in report.backends:
        lines.append(f"  {backend.backend} ({backend.dtype})")
        if backend.note:
            lines.append(f"    {backend.note}")
        width = max((len(g.part) for g in backend.groups), default=0)
        for group in backend.groups:
            line = f"    {group.part:<{width}} {group.num:>5}  {group.held}"
            lines.append(line + (f"  [dequantized: {group.dequantized}]" if group.dequantized else ""))
    dequantized = sum(g.num for b in report.backends for g in b.groups if g.dequantized)
    lines.append(f"  dequantized: {dequantized or 'nothing'}" + (" (marked above)" if dequantized else ""))
    lines += ["", *_memory_lines(report)]
    return lines


def _memory_lines(report: ModelReport) -> list[str]:
    count = report.stage_layers
    lines = [
        f"weight memory of a stage of {count} layer{'s' if count > 1 else ''} "
        "(what a node reports to the planner):",
        f"  {'stage':<22}" + "".join(f"{m.backend + ' (' + m.dtype + ')':>26}" for m in report.memory),
    ]
    for row, stage in enumerate(report.memory[0].stages):
        ends = [("embedding" if stage.start == 0 else ""), ("head" if stage.end == report.num_layers else "")]
        holds = " + ".join(e for e in ends if e)
        label = f"[{stage.start}, {stage.end})" + (f" + {holds}" if holds else "")
        cells = "".join(f"{_mib(m.stages[row].total):>26}" for m in report.memory)
        lines.append(f"  {label:<22}{cells}")
    return lines


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / MIB:.1f} MiB"
