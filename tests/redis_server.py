"""A real redis-server for the tests: on a free port, writing nothing to disk, started per module.

Tests use the `redis_url` fixture (tests/conftest.py): a server shared by the module's tests and
emptied (FLUSHALL) before each; a test may kill it (`redis_server` fixture) and the next one gets
it started again. Debian's redis-server must be on PATH; without it these tests fail saying how to
install it (`tests/real_parts.py`), unless MOHAWK_SKIP_MISSING names it.
"""

from __future__ import annotations

from pathlib import Path

import redis

from mohawk_cli.redis_server import RedisServer, find_redis_server
from tests.real_parts import missing


def start_redis(data_dir: Path, port: int | None = None) -> RedisServer:
    """A redis-server with no persistence (`--save "" --appendonly no`) under `data_dir`."""
    if find_redis_server() is None:
        missing("redis-server")
    return RedisServer(data_dir, port, persist=False, log_file=data_dir / "redis.log").start()


def ensure_running(server: RedisServer) -> None:
    """Start the server again (same port) if a test killed or stopped it."""
    if server.process is None or server.process.poll() is not None:
        server.start()


def flush(server: RedisServer) -> None:
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    try:
        client.flushall()
        client.script_flush()
    finally:
        client.close()
