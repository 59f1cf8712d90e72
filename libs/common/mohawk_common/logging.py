"""Structured logs for every Mohawk process: structlog over the standard library, one JSON object a line.

structlog's own loggers and plain `logging` loggers (libraries, `warnings`) end in one handler on
the root logger, so every line on stderr has the same shape: `timestamp` (ISO 8601, UTC),
`level`, `event`, `logger`, and whatever fields were bound (`request_id`, `node_id`, `stage`,
`subject`). `configure_logging` may be called again (a CLI flag, a test) and replaces only what it
installed before.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

from mohawk_common.errors import ConfigError

LEVELS = ("debug", "info", "warning", "error", "critical")
# Libraries that log a lot below WARNING; they are held at WARNING or above whatever the level.
CHATTY_LOGGERS = ("transformers", "huggingface_hub", "filelock", "urllib3")

# scheme://userinfo@ : a URL's user and password (or token), e.g. nats://mohawk:secret@host:4222
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s,]+)@")


def redact_url(text: str) -> str:
    """`text` with the password (or token) of every URL in it replaced by ***:
    nats://mohawk:secret@h:4222,nats://tok@h2 -> nats://mohawk:***@h:4222,nats://***@h2."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match["userinfo"].partition(":")
        return f"{match['scheme']}{user}:***@" if colon else f"{match['scheme']}***@"

    return _URL_USERINFO.sub(hide, text)


def _redact_urls(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """No log line carries a URL's password, whoever logged the URL (NATS, Redis, OTLP)."""
    for key, value in event.items():
        if isinstance(value, str) and "@" in value:
            event[key] = redact_url(value)
    return event


_SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.stdlib.ExtraAdder(),
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _redact_urls,
]


class _MohawkHandler(logging.StreamHandler[TextIO]):
    """The root handler `configure_logging` installs; its class tells it apart from anyone else's."""


def configure_logging(level: str = "info", *, json: bool = True, stream: TextIO | None = None) -> None:
    """Send structlog and standard-library records at `level` and above to `stream` (default stderr).

    `json=True` writes one JSON object per line; `json=False` a coloured-when-a-terminal console
    format for people. Python warnings are routed through `logging` too.
    """
    if level.lower() not in LEVELS:
        raise ConfigError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    numeric = logging.getLevelName(level.upper())
    renderer: list[Processor]
    if json:
        renderer = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        colors = (stream or sys.stderr).isatty()
        renderer = [structlog.dev.ConsoleRenderer(colors=colors)]
    handler = _MohawkHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _MohawkHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
    _route_transformers()
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def _route_transformers() -> None:
    """Send transformers' records to the root handler instead of its own plain-text one.

    transformers installs that handler when it is first imported; importing it here just for this
    would cost every process half a second, so only an already imported transformers is routed.
    """
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()


def get_logger(name: str, **bound: Any) -> structlog.stdlib.BoundLogger:
    """A logger named `name` with `bound` fields on every line; safe to create at import time."""
    return structlog.stdlib.get_logger(name, **bound)
