"""`--weights` and `--kv-cache-dtype`: one definition, on every command that builds stages."""

from __future__ import annotations

import pytest

from mohawk_cli.main import build_parser
from mohawk_cli.up import _format_args


def test_up_passes_the_formats_on_to_its_shard_nodes() -> None:
    args = build_parser().parse_args(["up", "--weights", "int4", "--kv-cache-dtype", "int8"])
    assert _format_args(args) == ("--weights", "int4", "--kv-cache-dtype", "int8")
    assert _format_args(build_parser().parse_args(["up"])) == ()


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["shard"], ["up"]])
def test_every_stage_command_refuses_an_unknown_format(command: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--weights", "q3"])
    args = build_parser().parse_args([*command, "--weights", "bf16"])
    assert args.weights == "bf16"
