"""`mohawk up`'s redis-server, without a whole cluster: which port it takes, what it says when
redis-server is not installed, its password (made once under the data dir; a client without it
refused), its persistence under the data dir, the URL the gateways get, and its supervision (an
exited redis-server is reported and started again)."""

from __future__ import annotations

import argparse
import socket
import stat
from pathlib import Path

import pytest
import redis

from mohawk_cli import up
from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_cli.ports import choose_port
from mohawk_cli.redis_server import find_redis_server
from mohawk_common.bus.server import free_port
from tests.real_parts import missing


def up_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    up.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_server_takes_the_port_asked_for_else_its_usual_one_else_a_free_one() -> None:
    assert choose_port(1234, 6379) == 1234
    usual = free_port()
    assert choose_port(None, usual) == usual
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", usual))
        taken.listen()
        other = choose_port(None, usual)
    assert other != usual and other > 0


def test_without_redis_server_up_says_how_to_install_it_and_runs_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server anywhere on it
    start, note = up.redis_choice(up_args())
    assert not start and note is not None
    assert "apt install redis-server" in note and "brew install redis" in note
    assert up.redis_choice(up_args("--no-redis")) == (False, None)
    # --auth without a Redis for its keys: refused before anything starts
    assert up.run_up(up_args("--auth", "--data-dir", str(tmp_path / "data"))) == 2
    err = capsys.readouterr().err
    assert "apt install redis-server" in err and "--auth needs a redis-server" in err
    assert not (tmp_path / "data").exists()


def test_up_starts_a_persistent_redis_and_hands_its_url_to_the_gateways(tmp_path: Path) -> None:
    if find_redis_server() is None:
        missing("redis-server")
    assert up.redis_choice(up_args()) == (True, None)
    port = free_port()
    spec = ClusterSpec(data_dir=tmp_path, redis=True, redis_port=port, gateway_env={"MOHAWK_AUTH": "true"})
    cluster = LocalCluster(spec)
    assert cluster.redis is not None
    password_file = tmp_path / "redis" / "password"
    password = password_file.read_text().strip()
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600 and len(password) >= 32
    assert LocalCluster(spec).redis.password == password  # type: ignore[union-attr]  # kept
    assert cluster.gateway_env() == {
        "MOHAWK_REDIS_URL": f"redis://:{password}@127.0.0.1:{port}/0",
        "MOHAWK_AUTH": "true",
    }
    assert LocalCluster(ClusterSpec(data_dir=tmp_path)).gateway_env() == {}  # redis is opt-in
    cluster.redis.start()
    try:
        assert password not in " ".join(cluster.redis.process.args)  # type: ignore[union-attr]  # not in `ps`
        stranger = redis.Redis.from_url(cluster.redis.public_url, socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            stranger.get("mohawk:probe")
        stranger.close()
        client = redis.Redis.from_url(cluster.redis.url, socket_timeout=5)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert Path(client.config_get("dir")["dir"]) == (tmp_path / "redis").resolve()
        client.set("mohawk:probe", "kept")
        client.close()
        process = cluster.redis.process
        assert process is not None
        process.kill()  # a crash: what the append-only file holds survives it
        process.wait()
        assert "redis" in cluster.exited()
        cluster.respawn("redis")  # what the supervisor does
        assert "redis" not in cluster.exited()
        client = redis.Redis.from_url(cluster.redis.url, socket_timeout=5)
        assert client.get("mohawk:probe") == b"kept"
        client.close()
    finally:
        cluster.redis.stop()
    assert (tmp_path / "redis" / "appendonlydir").is_dir()
    assert (tmp_path / "logs" / "redis.log").is_file()
