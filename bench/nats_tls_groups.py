"""Which key exchange each NATS TLS link negotiates, read off the wire.

Starts two nats-servers with TLS for clients and routes (certificates from a fresh bus CA, as
`mohawk up` and config/nats/cluster-*.conf use them), captures loopback with tshark while they form
their route and a Mohawk client (`connect`, Python's `ssl`) connects, and prints, per link, the
group in each ServerHello's key_share. Needs tshark and the right to capture (root):

    apt-get install -y tshark && python bench/nats_tls_groups.py
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from mohawk_common.bus.connect import connect
from mohawk_common.bus.nats_tls import LOCAL_HOSTS, init_ca, issue_server
from mohawk_common.bus.server import find_nats_server, free_port

GROUPS = {0x001D: "x25519", 0x0017: "secp256r1", 0x11EC: "X25519MLKEM768", 0x0200: "MLKEM768"}
FIELDS = ("tcp.srcport", "tcp.dstport", "tls.handshake.extensions_key_share_group")


def main() -> int:
    if shutil.which("tshark") is None:
        print("tshark not found: apt-get install -y tshark", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mohawk-tls-groups-") as tmp:
        root = Path(tmp)
        ca = init_ca(root / "pki")
        clients, routes = (free_port(), free_port()), (free_port(), free_port())
        pcap = root / "lo.pcap"
        ports = " or ".join(f"port {p}" for p in (*clients, *routes))
        capture = subprocess.Popen(
            ["tshark", "-i", "lo", "-f", f"tcp and ({ports})", "-w", str(pcap), "-q"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(2.0)  # tshark opens the interface
        servers = []
        try:
            for i in (0, 1):
                tls = issue_server(ca, root / f"tls-{i}", (f"nats-{i}", *LOCAL_HOSTS))
                conf = root / f"nats-{i}.conf"
                conf.write_text(
                    f"listen: 127.0.0.1:{clients[i]}\n"
                    f'include "{tls.dir.name}/{tls.client_conf.name}"\n'  # relative: nats-server's rule
                    f"cluster {{\n  name: groups\n  listen: 127.0.0.1:{routes[i]}\n"
                    f"  routes: [nats://127.0.0.1:{routes[1 - i]}]\n"
                    f'  include "{tls.dir.name}/{tls.route_conf.name}"\n}}\n'
                )
                servers.append(
                    subprocess.Popen(
                        [find_nats_server(), "-c", str(conf)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            time.sleep(2.0)  # the route forms
            asyncio.run(_client(f"tls://127.0.0.1:{clients[0]}", ca.cert))
            time.sleep(1.0)
        finally:
            for server in servers:
                server.terminate()
                server.wait()
            capture.terminate()
            capture.wait()
        out = subprocess.run(
            ["tshark", "-r", str(pcap), "-Y", "tls.handshake.type == 2", "-T", "fields"]
            + [part for f in FIELDS for part in ("-e", f)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    seen: Counter[tuple[str, str]] = Counter()
    for line in out.splitlines():
        src, _, group = [*line.split("\t"), "", "", ""][:3]
        link = (
            "client (Python ssl) -> nats-server"
            if int(src) in clients
            else "route (nats-server <-> nats-server)"
        )
        named = ", ".join(f"{GROUPS.get(int(g, 0), '?')} ({int(g, 0):#06x})" for g in group.split(",") if g)
        seen[link, named or "none (TLS 1.2)"] += 1
    print(f"Python {sys.version.split()[0]} ({ssl.OPENSSL_VERSION}); {_server_version()}")
    print("| link | ServerHello key_share group | handshakes |")
    print("|---|---|---|")
    for (link, named), count in sorted(seen.items()):
        print(f"| {link} | {named} | {count} |")
    return 0


async def _client(url: str, ca: Path) -> None:
    nc = await connect(url, name="groups", attempts=3, tls_ca=ca)
    await nc.flush()
    await nc.close()


def _server_version() -> str:
    return subprocess.run([find_nats_server(), "--version"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
