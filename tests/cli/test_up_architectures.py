"""Bring your own model: a GGUF of each architecture Mohawk reads, its tokenizer and chat template in
the file (tests/common/model_store/arch_gguf.py writes them: random Q4_K_M-mix weights, the bundled
SmolLM2's vocabulary), served with the defaults and nothing else.

`make test` runs one `mohawk up --model FILE` end to end on Qwen3-MoE (the architecture least like
the bundled Llama: experts, q/k norms, no permuted rows). `make models` (MOHAWK_ARCHITECTURES=1)
adds `mohawk generate --model FILE` in this process and `mohawk up` for every architecture (8–11 s
and 26–46 s each on 2 cores: each process reading a new file parses its 49k-token vocabulary). Every
file carries the same vocabulary and template, so what differs between architectures is the model,
whose logits tests/shard/engine/test_gguf_architectures.py checks against transformers in `make test`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mohawk_common.bus.server import free_port
from tests.cli.helpers import mohawk_in_process
from tests.common.model_store.arch_gguf import ARCHITECTURES, Q4_K_M, write_arch_gguf

EVERY_ARCHITECTURE = os.environ.get("MOHAWK_ARCHITECTURES") == "1"
CURL_BODY = re.compile(r"-d '(\{.*\})'")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arch-gguf")


def arch_file(directory: Path, arch: str) -> Path:
    """`random-<arch>.gguf` in `directory`, written on first use."""
    path = directory / f"random-{arch}.gguf"
    if not path.exists():
        write_arch_gguf(path, arch, formats=Q4_K_M)
    return path


@pytest.mark.skipif(not EVERY_ARCHITECTURE, reason="every architecture: MOHAWK_ARCHITECTURES=1 (make models)")
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_generate_with_the_files_tokenizer(
    arch: str, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = arch_file(model_dir, arch)
    code, out, err = mohawk_in_process(
        capsys, "generate", "--model", str(path), "--prompt", "Hi", "--max-tokens", "4"
    )
    assert code == 0, err
    assert len(out) > 1 and "Traceback" not in err  # some text, then the final newline


def serve_and_ask(model: Path, tmp_path: Path) -> tuple[str, dict[str, object]]:
    """`mohawk up --model MODEL` (ports and data dir apart, its defaults), asked the banner's own
    curl request; returns the banner and the reply, after Ctrl-C stopped everything."""
    port = free_port()
    ports = ("--port", str(port), "--nats-port", str(free_port()), "--redis-port", str(free_port()))
    ports += ("--telemetry-port", str(free_port()), "--data-dir", str(tmp_path / "data"))
    command = [str(Path(sys.executable).parent / "mohawk"), "up", "--model", str(model), *ports]
    banner = tmp_path / "stdout.txt"
    with banner.open("wb") as stdout:
        proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while "Mohawk is ready" not in banner.read_text():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "mohawk up was not ready in time"
            time.sleep(0.5)
        match = CURL_BODY.search(banner.read_text())
        assert match is not None, banner.read_text()
        body = json.loads(match.group(1)) | {"max_tokens": 6}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        reply = httpx.post(url, json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return banner.read_text(), reply.json()


def _check_served(arch: str, model_dir: Path, tmp_path: Path) -> None:
    path = arch_file(model_dir, arch)
    banner, reply = serve_and_ask(path, tmp_path)
    assert f'model "{path.stem}"' in banner  # the name the gateway serves, which the curl line uses
    assert reply["model"] == path.stem
    usage = reply["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] >= 1, reply
    # the file's chat template (SmolLM2's ChatML, with its default system turn) made the prompt
    assert usage["prompt_tokens"] > 20, reply


@pytest.mark.slow
def test_mohawk_up_serves_a_moe_gguf_with_defaults(model_dir: Path, tmp_path: Path) -> None:
    _check_served("qwen3moe", model_dir, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not EVERY_ARCHITECTURE, reason="every architecture: MOHAWK_ARCHITECTURES=1 (make models)")
@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "qwen3moe"])
def test_mohawk_up_serves_each_architecture_with_defaults(arch: str, model_dir: Path, tmp_path: Path) -> None:
    _check_served(arch, model_dir, tmp_path)
