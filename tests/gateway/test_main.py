"""The process: flags over env over defaults, `python -m mohawk_gateway` serving and draining on SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mohawk_common.bus.server import free_port
from mohawk_common.errors import ConfigError
from mohawk_gateway.main import add_arguments, run, settings_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_override_environment_and_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOHAWK_PORT", "9001")
    monkeypatch.setenv("MOHAWK_REQUEST_TIMEOUT_S", "30")
    settings = settings_from_args(parse("--host", "0.0.0.0", "--nats-url", "nats://a:1,nats://b:2"))
    assert (settings.host, settings.port, settings.request_timeout_s) == ("0.0.0.0", 9001, 30.0)
    assert settings.nats_servers == ["nats://a:1", "nats://b:2"]
    assert settings.served_model == "smollm2-135m-instruct"
    settings = settings_from_args(
        parse("--port", "8100", "--served-model-name", "mine", "--log-level", "debug")
    )
    assert (settings.port, settings.served_model, settings.log_level) == (8100, "mine", "debug")


def test_bad_settings_are_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="port"):
        settings_from_args(parse("--port", "70000"))
    assert run(parse("--port", "70000")) == 2
    assert run(parse("--model", str(tmp_path / "missing.gguf"))) == 2
    assert run(parse("--log-level", "loud")) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith("mohawk gateway: error: ") for line in lines)
    assert "does not exist" in lines[1] and "Traceback" not in "".join(lines)


def test_without_a_certificate_it_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOHAWK_")}
    result = subprocess.run(
        [sys.executable, "-m", "mohawk_gateway", "--port", str(free_port()), "--pki-dir", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no valid gateway certificate" in lines[0] and "--insecure" in lines[0]


def test_module_serves_health_while_nats_is_down_and_drains_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    not_a_model = tmp_path / "empty-model"
    not_a_model.mkdir()
    args = ["--port", str(port), "--nats-url", f"nats://127.0.0.1:{free_port()}", "--model", str(not_a_model)]
    args.append("--insecure")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOHAWK_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "mohawk_gateway", *args, "--log-level", "warning"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and process.poll() is None, "gateway did not come up"
                time.sleep(0.1)
            ready = client.get("/ready")
            assert ready.status_code == 503
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = process.stderr.read().decode() if process.stderr else ""
    assert "Traceback" not in stderr
    assert '"nats unreachable, retrying"' in stderr or "tokenizer not loaded" in stderr
