"""`configure_logging`: JSON lines with bound fields, stdlib records in the same shape, idempotence."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime

import pytest
import structlog

from mohawk_common.errors import ConfigError
from mohawk_common.logging import configure_logging, get_logger


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Leave the process's logging as it was: other tests share it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    transformers_level = logging.getLogger("transformers").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("transformers").setLevel(transformers_level)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_line_has_standard_and_bound_fields() -> None:
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    get_logger("mohawk.test", node_id="node-1", stage=0).info("step done", num_tokens=7)
    (record,) = lines(stream)
    assert record["event"] == "step done"
    assert record["level"] == "info"
    assert record["logger"] == "mohawk.test"
    assert (record["node_id"], record["stage"], record["num_tokens"]) == ("node-1", 0, 7)
    assert datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00")).tzinfo is not None


def test_logger_made_before_configuration_follows_it() -> None:
    log = get_logger("mohawk.early", request_id="r1")
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    log.bind(subject="mohawk.v1.tok.r1").warning("late")
    (record,) = lines(stream)
    assert (record["request_id"], record["subject"], record["level"]) == ("r1", "mohawk.v1.tok.r1", "warning")


def test_level_filters_structlog_and_stdlib() -> None:
    stream = io.StringIO()
    configure_logging("warning", stream=stream)
    get_logger("mohawk.test").info("hidden")
    logging.getLogger("some.library").info("hidden too")
    logging.getLogger("some.library").error("shown %d", 42)
    (record,) = lines(stream)
    assert (record["event"], record["logger"], record["level"]) == ("shown 42", "some.library", "error")


def test_exceptions_are_rendered_inside_the_json_line() -> None:
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    try:
        raise ValueError("boom")
    except ValueError:
        get_logger("mohawk.test").exception("failed")
    (record,) = lines(stream)
    assert "ValueError: boom" in str(record["exception"])


def test_reconfiguring_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", stream=first)
    configure_logging("info", stream=second)
    get_logger("mohawk.test").info("once")
    assert first.getvalue() == ""
    assert len(lines(second)) == 1


def test_console_renderer_when_not_json() -> None:
    stream = io.StringIO()
    configure_logging("debug", json=False, stream=stream)
    get_logger("mohawk.test", node_id="n").debug("hello")
    text = stream.getvalue()
    assert "hello" in text and "node_id" in text
    assert not text.lstrip().startswith("{")


def test_transformers_is_held_at_warning() -> None:
    configure_logging("debug", stream=io.StringIO())
    assert logging.getLogger("transformers").getEffectiveLevel() == logging.WARNING


def test_unknown_level_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="log level must be one of"):
        configure_logging("loud")


def test_no_line_carries_a_url_password() -> None:
    """Whoever logs a NATS (or Redis) URL, structlog or stdlib, the password is not in the line."""
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    url = "nats://mohawk-shard:s3cret@10.0.0.1:4222,nats://10.0.0.2:4222"
    get_logger("mohawk.test").info("node up", nats=url)
    logging.getLogger("some.library").warning("connecting to %s", "redis://:hunter2@cache:6379/0")
    text = stream.getvalue()
    assert "s3cret" not in text and "hunter2" not in text
    first, second = lines(stream)
    assert first["nats"] == "nats://mohawk-shard:***@10.0.0.1:4222,nats://10.0.0.2:4222"
    assert second["event"] == "connecting to redis://:***@cache:6379/0"
