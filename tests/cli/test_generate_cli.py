"""`mohawk generate` as a user runs it: a real subprocess, stdout holds only the completion. The
comparisons of two runs' texts (a split, a seed) run in this process, against the subprocess's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli.helpers import mohawk, mohawk_in_process

# "What is the capital of France?" alone is a near tie at its first token for this 135M model: int8
# activations (Mohawk's native default, and llama.cpp on the same file) answer "L'Étoile, la ..."
# where fp32 answers "The capital of France is Paris."; with this prompt all three say Paris
PROMPT = "What is the capital of France? Tell me about it."


@pytest.fixture(scope="module")
def greedy_whole() -> subprocess.CompletedProcess[str]:
    return mohawk("generate", "--prompt", PROMPT, "--max-tokens", "24")


def test_prints_only_the_completion(greedy_whole: subprocess.CompletedProcess[str]) -> None:
    assert greedy_whole.returncode == 0, greedy_whole.stderr
    assert "Paris" in greedy_whole.stdout
    assert "<|im_start|>" not in greedy_whole.stdout and "{" not in greedy_whole.stdout
    assert "Traceback" not in greedy_whole.stderr


def test_split_prints_the_same_greedy_text(
    greedy_whole: subprocess.CompletedProcess[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("generate", "--prompt", PROMPT, "--max-tokens", "24", "--split", "10,20")
    code, out, err = mohawk_in_process(capsys, *args)
    assert code == 0, err
    assert out == greedy_whole.stdout


def test_same_seed_same_text(
    greedy_whole: subprocess.CompletedProcess[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("generate", "--prompt", "Tell me a story.", "--max-tokens", "16", "--temperature", "1.0")
    first = mohawk_in_process(capsys, *args, "--seed", "7")
    second = mohawk_in_process(capsys, *args, "--seed", "7")
    assert first[0] == 0, first[2]
    assert first[1] == second[1] and first[1].strip()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--model", "/nonexistent/model.gguf"), "does not exist"),
        (("--temperature", "-1"), "temperature"),
        (("--max-tokens", "0"), "max_tokens"),
        (("--split", "40"), "split"),
        (("--split", "x"), "--split"),
    ],
    ids=["unknown-path", "bad-temperature", "bad-max-tokens", "split-out-of-range", "split-not-numbers"],
)
def test_bad_input_is_one_clear_line(args: tuple[str, ...], needle: str) -> None:
    result = mohawk("generate", "--prompt", "hi", *args)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0] and "Traceback" not in result.stderr


def test_unsupported_architecture_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    (tmp_path / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    result = mohawk("generate", "--prompt", "hi", "--model", str(tmp_path))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert "gpt2" in lines[0] and "Traceback" not in result.stderr


def test_prompt_longer_than_context_is_one_clear_line() -> None:
    result = mohawk("generate", "--prompt", "word " * 9000, "--max-tokens", "4")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert "context" in lines[0] and "Traceback" not in result.stderr
