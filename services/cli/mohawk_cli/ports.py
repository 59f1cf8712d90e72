"""Which port a local server of `mohawk up` listens on: the one asked for, else its usual one when
nothing listens there, else any free one (the banner says which)."""

from __future__ import annotations

import socket

from mohawk_common.bus.server import free_port


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_port(requested: int | None, usual: int) -> int:
    """`requested` if given, else `usual` when it is free on 127.0.0.1, else any free port."""
    if requested is not None:
        return requested
    return usual if port_is_free(usual) else free_port()
