"""Hosts made of Linux network namespaces: a switch namespace holding one bridge, and one namespace
per host joined to it by a veth pair, addresses in a private /24.

Nothing touches the root namespace's interfaces: the bridge and every veth's switch end live in
the switch namespace, each host sees only its own `eth0` and `lo`, and the names carry a run id
(`mh<pid><hex>-...`), so parallel runs never collide. A host's processes start under
`ip netns exec`; the test's own clients run in a thread that joined a host's namespace (`call_in`),
so every socket they open lives there. `Lab.close` kills whatever still runs in the namespaces
(only this run's processes can be in them) and deletes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
IP_TIMEOUT_S = 10.0
NETNS_DIR = "/run/netns"


class NetnsUnavailable(RuntimeError):
    """This machine cannot make network namespaces here (not root, no `ip`, no veth/bridge)."""


@dataclass(frozen=True, slots=True)
class Host:
    name: str  # short name: a, b, c, ...
    netns: str  # the namespace's name (unique per run)
    address: str  # on the lab's /24
    switch_port: str  # its veth's end on the bridge, in the switch namespace


@dataclass
class Lab:
    run_id: str
    subnet: str  # the first three octets, e.g. "10.213.7"
    switch: str  # the namespace holding the bridge
    hosts: dict[str, Host] = field(default_factory=dict)

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def set_link(self, name: str, up: bool) -> None:
        """Plug host `name`'s cable in or out (its veth's end on the bridge)."""
        ip("-n", self.switch, "link", "set", self.hosts[name].switch_port, "up" if up else "down")

    def namespaces(self) -> list[str]:
        return [self.switch, *(h.netns for h in self.hosts.values())]

    def close(self) -> None:
        """Kill every process still in this lab's namespaces, then delete them; never raises."""
        for netns in self.namespaces():
            _kill_inside(netns)
        for netns in self.namespaces():
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=IP_TIMEOUT_S)


def ip(*args: str) -> str:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def make_lab(host_names: Sequence[str], first_octet: int = 1) -> Lab:
    """A switch and one host per name (addresses .first_octet, .first_octet+1, ... in order).
    NetnsUnavailable (with the command that failed) where namespaces cannot be made; whatever was
    made by then is deleted."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("needs root (ip netns add)")
    run_id = f"mh{os.getpid() % 10000}{secrets.token_hex(2)}"
    lab = Lab(run_id, _unused_subnet(), f"{run_id}-sw")
    try:
        ip("netns", "add", lab.switch)
        ip("-n", lab.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", lab.switch, "link", "set", "br0", "up")
        for offset, name in enumerate(host_names):
            add_host(lab, name, first_octet + offset)
    except BaseException:
        lab.close()
        raise
    return lab


def add_host(lab: Lab, name: str, octet: int) -> Host:
    """Host `name` at <subnet>.<octet>, plugged into the lab's bridge."""
    host = Host(name, f"{lab.run_id}-{name}", f"{lab.subnet}.{octet}", f"p-{name}")
    lab.hosts[name] = host  # registered first, so close() deletes it even if a step below fails
    ip("netns", "add", host.netns)
    ip("-n", lab.switch, "link", "add", host.switch_port, "type", "veth", "peer", "name", "eth0",
       "netns", host.netns)  # fmt: skip
    ip("-n", lab.switch, "link", "set", host.switch_port, "master", "br0", "up")
    ip("-n", host.netns, "link", "set", "lo", "up")
    ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
    ip("-n", host.netns, "link", "set", "eth0", "up")
    return host


def _unused_subnet() -> str:
    """A 10.x.y/24 that no route of the root namespace mentions (the lab's own namespaces are
    isolated anyway; this keeps its addresses unambiguous in logs)."""
    routes = ip("-4", "route", "show", "table", "all") + ip("-4", "addr")
    for _ in range(64):
        subnet = f"10.{secrets.choice(range(200, 250))}.{secrets.randbelow(256)}"
        if f"{subnet}." not in routes:
            return subnet
    raise NetnsUnavailable("no unused 10.x.y.0/24 found")


def _kill_inside(netns: str) -> None:
    try:
        out = subprocess.run(
            ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=IP_TIMEOUT_S
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    for pid in (int(p) for p in out.split() if p.isdigit()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


_libc = ctypes.CDLL(None, use_errno=True)


class InNetns(Generic[T]):
    """`fn()` running in a new thread that joined namespace `netns` first: every socket it opens
    (and every thread it starts) is inside. A daemon thread: one that outlives its caller's
    deadline dies with the process, and its sockets with the namespace."""

    def __init__(self, netns: str, fn: Callable[[], T]) -> None:
        self.netns = netns
        self.fn = fn
        self._outcome: list[T] = []
        self._failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name=f"in-{netns}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            fd = os.open(f"{NETNS_DIR}/{self.netns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns({self.netns}): {os.strerror(errno)}")
            finally:
                os.close(fd)
            self._outcome.append(self.fn())
        except BaseException as exc:
            self._failure.append(exc)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout_s: float) -> T:
        """What `fn` returned (or raised); TimeoutError when it runs past `timeout_s` from now."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            name = getattr(self.fn, "__name__", "a call")
            raise TimeoutError(f"{name} in {self.netns} ran past {timeout_s:.0f} s")
        if self._failure:
            raise self._failure[0]
        return self._outcome[0]


def call_in(netns: str, fn: Callable[[], T], timeout_s: float) -> T:
    """`fn()` inside namespace `netns` (see InNetns), waited for at most `timeout_s`."""
    return InNetns(netns, fn).result(timeout_s)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.25) -> float:
    """Poll `condition` until true; the seconds it took. TimeoutError naming `what` past the deadline."""
    start = time.monotonic()
    deadline = start + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic() - start
        time.sleep(poll_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
