"""`mohawk bus server`: nats-server's HTTP monitoring endpoints, summarised as `nats server` does.

`/varz` (the server: name, version, uptime, connections, traffic), `/connz` (each connection: its
name, which Mohawk sets to the process, e.g. `shard-shard-1`, and its pending bytes and message
counts) and `/jsz` (JetStream: memory and file storage in use against their limits, streams,
consumers, messages). `mohawk up` starts nats-server with its monitoring port and prints it; the
compose files expose 8222.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from mohawk_cli.bus import BusInspectError, format_table
from mohawk_cli.bus.jetstream import human_bytes


def fetch(base_url: str, path: str) -> dict[str, Any]:
    url = f"{base_url.rstrip('/')}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return dict(json.loads(response.read()))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise BusInspectError(f"cannot read {url}: {getattr(exc, 'reason', exc)}") from None


def show_server(base_url: str) -> str:
    varz = fetch(base_url, "/varz")
    connz = fetch(base_url, "/connz?sort=bytes_to&limit=256")
    jsz = fetch(base_url, "/jsz")
    lines = [
        f"Server {varz.get('server_name', '?')} ({varz.get('server_id', '?')[:12]}), "
        f"nats-server {varz.get('version', '?')}",
        f"  uptime {varz.get('uptime', '?')}, {varz.get('connections', 0)} connections "
        f"(total {varz.get('total_connections', 0)}), {varz.get('subscriptions', 0)} subscriptions",
        f"  in {varz.get('in_msgs', 0)} messages / {human_bytes(varz.get('in_bytes', 0))}, "
        f"out {varz.get('out_msgs', 0)} messages / {human_bytes(varz.get('out_bytes', 0))}, "
        f"slow consumers {varz.get('slow_consumers', 0)}",
        f"  max payload {human_bytes(varz.get('max_payload', 0))}",
        "",
    ]
    rows = [
        [
            c.get("name") or "(unnamed)",
            f"{c.get('ip', '?')}:{c.get('port', '?')}",
            c.get("subscriptions", 0),
            c.get("in_msgs", 0),
            c.get("out_msgs", 0),
            human_bytes(c.get("pending_bytes", 0)),
            c.get("uptime", ""),
        ]
        for c in connz.get("connections") or []
    ]
    lines.append(
        format_table(["connection", "address", "subs", "in msgs", "out msgs", "pending", "uptime"], rows)
    )
    config = jsz.get("config") or {}
    lines += [
        "",
        "JetStream:" if not jsz.get("disabled") else "JetStream: disabled",
        f"  memory {human_bytes(jsz.get('memory', 0))} of {human_bytes(config.get('max_memory', 0))}, "
        f"file storage {human_bytes(jsz.get('storage', 0))} of {human_bytes(config.get('max_storage', 0))}",
        f"  {jsz.get('streams', 0)} streams, {jsz.get('consumers', 0)} consumers, "
        f"{jsz.get('messages', 0)} messages "
        f"({human_bytes(jsz.get('bytes', 0))}), API calls {(jsz.get('api') or {}).get('total', 0)} "
        f"(errors {(jsz.get('api') or {}).get('errors', 0)})",
    ]
    return "\n".join(lines)
