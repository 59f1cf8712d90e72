"""mkdocs hook: the configuration page's tables, generated from the settings classes themselves.

Every setting's name, environment variable, default and description come from its pydantic field,
so the page cannot drift from the code: `<!-- settings -->` in `docs/configuration.md` is replaced
by one table per process (the bus settings every process shares first, then each service's own).
"""

from __future__ import annotations

from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = "<!-- settings -->"


def _classes() -> list[tuple[str, type[Any], set[str]]]:
    from mohawk_common.bus.config import BusSettings
    from mohawk_coordinator.config import CoordinatorSettings
    from mohawk_gateway.config import GatewaySettings
    from mohawk_shard.node.config import NodeSettings

    shared = set(BusSettings.model_fields)
    return [
        ("Every process (the bus)", BusSettings, set()),
        ("Shard nodes (`shard:`)", NodeSettings, shared),
        ("The coordinator (`coordinator:`)", CoordinatorSettings, shared),
        ("The gateway (`gateway:`)", GatewaySettings, shared),
    ]


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "(computed)"
    if field.default is PydanticUndefined:
        return "(required)"
    return f"`{field.default!r}`".replace("|", "\\|")


def _table(settings: type[Any], skip: set[str]) -> str:
    rows = ["| setting | environment | default | what |", "|---|---|---|---|"]
    for name, field in settings.model_fields.items():
        if name in skip:
            continue
        what = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{name}` | `MOHAWK_{name.upper()}` | {_default(field)} | {what} |")
    return "\n".join(rows)


def _env_table() -> str:
    """The environment variables read outside the settings classes, as their modules register them."""
    import mohawk_common.model_store.gguf_cache  # noqa: F401  (each registers its knobs on import)
    import mohawk_shard.kernels.library  # noqa: F401
    import mohawk_telemetry.main  # noqa: F401
    from mohawk_common.env_knobs import KNOBS

    rows = ["| environment | default | what |", "|---|---|---|"]
    for knob in sorted(KNOBS.values(), key=lambda k: k.name):
        what = knob.what.replace("|", "\\|")
        rows.append(f"| `{knob.name}` | `{knob.default}` | {what} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    tables = [f"### {title}\n\n{_table(cls, skip)}" for title, cls, skip in _classes()]
    tables.append(f"### Outside the settings (read where they are used)\n\n{_env_table()}")
    return markdown.replace(MARKER, "\n\n".join(tables))
