"""A gateway whose model file is bad stays up and answers 503 with a reason, never 500."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from mohawk_common.bus.server import free_port
from mohawk_gateway.app import create_app
from tests.gateway.conftest import ServerThread, gateway_settings, wait_until

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    "content",
    [b"", b"GGUF\x03\x00\x00\x00", b"<html>404 Not Found</html>"],
    ids=["empty", "truncated", "html"],
)
def test_bad_model_file_is_503_not_500(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    settings = gateway_settings(f"nats://127.0.0.1:{free_port()}", model=str(path))
    server = ServerThread(create_app(settings)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            assert client.get("/health").status_code == 200
            wait_until(
                lambda: "tokenizer could not be loaded" in client.get("/ready").json().get("reason", ""),
                timeout=60,  # the first load imports transformers in the thread
            )
            response = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]})
            assert response.status_code == 503
            assert "the model's tokenizer could not be loaded" in response.json()["error"]["message"]
    finally:
        server.stop()
