"""Fixtures shared by every test package: a real nats-server on a free port, per test; a real
redis-server on a free port, per module, emptied before each test (`redis_url`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mohawk_cli.redis_server import RedisServer
from mohawk_common.bus.server import NatsServer
from tests.redis_server import ensure_running, flush, start_redis

FULL_FORM = os.environ.get("MOHAWK_FULL") == "1"


# Every test under these starts a cluster of processes, runs a benchmark's short form, or runs a
# real model end to end many times (each file 20 s to two minutes on a 2-core machine, by `make
# test`'s --durations): `slow`, so `pytest -m "not slow"` is the inner loop. `make test` runs them all.
SLOW_PLACES = (
    "tests/bench/",
    "tests/chaos/",
    "tests/integration/",
    "tests/multihost/",
    "tests/loadtest/test_loadtest_short.py",
    "tests/cli/test_up.py",
    "tests/cli/test_up_architectures.py",
    "tests/cli/test_generate_cli.py",
    "tests/cli/test_slice_cli.py",
    "tests/telemetry/test_telemetry_cluster.py",
    "tests/security/test_slices_on_the_bus.py",
    "tests/security/test_bus_security.py",
    "tests/security/attacks/test_control_plane.py",
    "tests/common/model_store/test_gguf_cache.py",
    "tests/common/model_store/test_store_bundled.py",
    "tests/shard/backends/test_traced_decode.py",
    "tests/shard/engine/test_batch_invariance.py",
    "tests/shard/engine/test_engine_behaviour.py",
    "tests/shard/engine/test_mlx.py",
    "tests/shard/engine/test_reference_bundled.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests in `SLOW_PLACES` are `slow`. `full_form` cases run only in the long forms (MOHAWK_FULL=1:
    `make chaos`, `make bench`, `make full`): `make test` keeps one case of each scenario and skips
    the rest, saying where they run."""
    root = Path(str(config.rootpath))
    for item in items:
        where = Path(str(item.path)).relative_to(root).as_posix()
        if where.startswith(SLOW_PLACES):
            item.add_marker(pytest.mark.slow)
    if FULL_FORM:
        return
    skip = pytest.mark.skip(
        reason="long form only: `make full` runs it (`make chaos` and `make bench` run their own)"
    )
    for item in items:
        if item.get_closest_marker("full_form") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def gguf_metadata_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The run's own GGUF metadata cache (`model_store/gguf_cache.py`), shared by the processes it
    starts, so a run neither reads nor fills the user's."""
    if "MOHAWK_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["MOHAWK_CACHE_DIR"] = str(tmp_path_factory.mktemp("mohawk-cache"))
    try:
        yield
    finally:
        os.environ.pop("MOHAWK_CACHE_DIR", None)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream (file storage under tmp_path); tests may kill/restart it."""
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the module's tests (where redis-server is missing they fail saying how to
    install it, unless MOHAWK_SKIP_MISSING names it: `tests/real_parts.py`); a test
    may kill it, and the next `redis_url` starts it again on the same port."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of a running, empty Redis (redis://127.0.0.1:PORT/0)."""
    ensure_running(redis_server)
    flush(redis_server)
    return redis_server.url


@pytest.fixture(scope="session")
def hf_reference_model() -> Any:
    """Hugging Face transformers' model of the bundled GGUF, fp32, loaded once a run (15 s here):
    the reference that engine tests compare logits and tokens with, and model-store tests weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from mohawk_common.model_store import bundled_model_path

    path = bundled_model_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    )
    return model.eval()


@pytest.fixture(scope="session")
def reference() -> dict[str, str]:
    """The single-process engine's greedy texts of the cluster prompts, computed once for every
    module that compares a cluster's answers with them (integration, chaos)."""
    from tests.integration.cluster_helpers import reference_texts

    return reference_texts()
