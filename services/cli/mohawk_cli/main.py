"""`mohawk`: one command line for every Mohawk process and tool.

The CLI is the one place that reaches into services, and it does so lazily, per subcommand, so
`mohawk --help` stays fast and a subcommand loads only what it runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from mohawk_common.errors import MohawkError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line on stderr and exit 2, instead of argparse's usage block."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def _split_points(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--split wants comma-separated layer indices, got {text!r}"
        ) from None


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    from mohawk_shard.config import add_format_flags

    parser.add_argument("--model", help="GGUF file or safetensors directory (default: bundled SmolLM2-135M)")
    parser.add_argument("--split", type=_split_points, default=[], help="layer split points, e.g. 10,20")
    parser.add_argument(
        "--backends",
        type=lambda text: [b.strip() for b in text.split(",") if b.strip()],
        default=[],
        help="one backend per stage, e.g. torch,mlx,torch (default torch)",
    )
    parser.add_argument("--device", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", help="auto, float32, bfloat16, float16")
    add_format_flags(parser)
    parser.add_argument("--log-level", default="warning", help="log level on stderr (default: warning)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mohawk", description="Distributed, post-quantum-secured LLM inference.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = commands.add_parser("generate", help="complete one chat message and print the reply")
    gen.add_argument("--prompt", required=True, help="the user message")
    gen.add_argument("--system", help="an optional system message")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    _add_engine_flags(gen)
    chat = commands.add_parser("chat", help="talk to the model in the terminal (in-process engine)")
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.add_argument("--temperature", type=float, default=0.7)
    _add_engine_flags(chat)
    from mohawk_cli import up

    up.add_arguments(
        commands.add_parser("up", help="start a whole local cluster: NATS, coordinator, shards, gateway")
    )
    for name, module, text in _SERVICES:
        service = commands.add_parser(name, help=text)
        importlib.import_module(module).add_arguments(service)
    return parser


# name, module with add_arguments(parser) and run(args), help
_SERVICES = [
    ("gateway", "mohawk_gateway.main", "run the OpenAI-compatible HTTP gateway"),
    (
        "coordinator",
        "mohawk_coordinator.main",
        "run a coordinator replica (leader election, registry, plans)",
    ),
    ("shard", "mohawk_shard.node.main", "run one shard node"),
    ("plan", "mohawk_coordinator.explain", "print the current placement plan (--explain: and why)"),
    ("pki", "mohawk_cli.pki", "operator PKI: init a root, issue node bundles, revoke, show"),
    ("slice", "mohawk_cli.slices", "build (pack) and ship (push) signed, encrypted slice packages"),
    ("tenant", "mohawk_cli.tenant", "tenants, their API keys and limits (in Redis): add, ls, rm"),
    ("telemetry", "mohawk_telemetry.main", "run the telemetry service: the cluster's /metrics and dashboard"),
    ("bus", "mohawk_cli.bus", "inspect the bus without the nats CLI: streams, consumers, kv, sub, server"),
    ("model", "mohawk_cli.model_inspect", "inspect a model file: stored types, kernels per backend, memory"),
]


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    args = build_parser().parse_args(argv)
    for name, module, _text in _SERVICES:
        if args.command == name:
            return int(importlib.import_module(module).run(args))
    if args.command == "up":
        from mohawk_cli.up import run_up

        return run_up(args)
    from mohawk_common.logging import configure_logging

    configure_logging(args.log_level)
    try:
        if args.command == "generate":
            from mohawk_cli.generate import run_generate

            return run_generate(args)
        from mohawk_cli.generate import run_chat

        return run_chat(args)
    except MohawkError as exc:
        print(f"mohawk: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
