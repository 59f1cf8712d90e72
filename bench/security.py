"""Security benchmark: what the post-quantum channels cost, in one run.

1. The channel handshake (X25519 + ML-KEM-768, both transcripts signed with ECDSA P-256 + ML-DSA-65,
   three messages), in process, so the figure is the cryptography alone (the NATS round trips add
   two request/replies, ~0.7 ms each, see DESIGN.md).
2. Sealing a request for stage 0 and opening it (hybrid KEM + AES-GCM + a hybrid signature and
   its check), paid once per request.
3. AES-256-GCM seal + open of one frame by size (a decode step of 1 and 32 sequences, a 512-token
   prefill chunk of SmolLM2's 576-wide fp32 hidden states), paid per hop.
4. End to end: three `mohawk up` clusters given the same 32 concurrent streaming requests, in
   ABC-CBA order so drift hits all alike: as `mohawk up` runs (certificates, everything encrypted
   end to end, and NATS with users per role and TLS only), the same with NATS open (no TLS, no
   users), and --insecure (plaintext frames) on open NATS. The first two compare NATS's TLS and
   auth, the last two Mohawk's own encryption. The short form runs the first and the last only
   (what `mohawk up` runs against everything off), one cluster fewer on CI's two cores.
5. `--identities`: what a NATS user per process costs (its JWT, its scoped permissions checked on
   every publish and subscription), two 3-node clusters side by side in ABBA order: as `mohawk up`
   runs, and the same NATS with TLS but no users. (The role users it replaced are gone, so this
   is measured against no users at all: the stricter baseline.)
Figures are medians (min–max). `python bench/security.py` runs the short form, `--full` the full
form (`make bench`); `--micro-only` parts 1–3 alone (`make test`, in seconds).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed import ClusterSetup, questions
from engine import Stat
from results_file import write_results

from mohawk_common.bus.requests import new_token_key, open_request, seal_request
from mohawk_common.bus.security import Security
from mohawk_common.logging import configure_logging
from mohawk_pqc.channel import FrameReceiver, FrameSender
from mohawk_pqc.handshake import HandshakeInitiator, HandshakeResponder
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_proto.v1 import bus_pb2

HIDDEN = 576 * 4  # SmolLM2-135M's hidden size, fp32 bytes
FRAME_SIZES = {"decode, 1 seq (2.3 KB)": HIDDEN, "decode, 32 seqs (74 KB)": 32 * HIDDEN}
FRAME_SIZES["prefill chunk, 512 tokens (1.2 MB)"] = 512 * HIDDEN


@dataclass(frozen=True)
class Form:
    repeats: int
    micro_repeats: int
    nodes: int
    tokens: int
    num_concurrent: int = 32
    open_nats_encrypted: bool = True  # the middle cluster: Mohawk's encryption on open NATS


# Two runs each, in ABBA order, after a concurrent warm-up: with one cold run each, CI once
# measured 0.65x, and a cluster's first concurrent run came out ~40% slower than its later ones.
SHORT = Form(repeats=2, micro_repeats=20, nodes=2, tokens=8, open_nats_encrypted=False)
FULL = Form(repeats=6, micro_repeats=200, nodes=3, tokens=48)


def timed(fn: Callable[[], object], repeats: int) -> Stat:
    """Milliseconds per call."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return Stat.of(times)


def micro(form: Form, pki: Path) -> dict[str, Stat]:
    init_pki(pki)
    a = load_bundle(issue_node(pki, "a", "shard", models=("m",)), role="shard")
    b = load_bundle(issue_node(pki, "b", "shard", models=("m",)), role="shard")
    gateway = load_bundle(issue_node(pki, "gw", "gateway", models=("m",)), role="gateway")
    kem = CryptographyKem()

    def handshake() -> None:
        initiator = HandshakeInitiator(
            a.identity, a.trust, plan_version=1, responder_id="b", accept_peer=lambda *_: None, kem=kem
        )
        responder = HandshakeResponder(b.identity, b.trust, accept_peer=lambda *_: None, kem=kem)
        finish, _ = initiator.handle_response(responder.respond(initiator.init_message()))
        responder.finish(finish)

    request = bus_pb2.GenerateRequest(
        request_id="r1", model="m", prompt_token_ids=list(range(300)), token_key=new_token_key()
    )
    sender_side, receiver_side = Security(gateway, kem, role="gateway"), Security(a, kem, role="shard")

    def seal_and_open() -> None:
        data, headers = seal_request(request, sender_side)
        open_request(data, headers, receiver_side, "m")

    results = {
        "handshake (3 messages, both sides)": timed(handshake, max(5, form.micro_repeats // 10)),
        "seal + open one request (300 tokens)": timed(seal_and_open, max(5, form.micro_repeats // 10)),
    }
    key = os.urandom(32)
    for label, size in FRAME_SIZES.items():
        results[f"AES-256-GCM seal + open, {label}"] = timed(_frame_round_trip(key, size), form.micro_repeats)
    return results


def _frame_round_trip(key: bytes, size: int) -> Callable[[], None]:
    sender, receiver, payload = FrameSender(key), FrameReceiver(key), os.urandom(size)

    def frame() -> None:
        seq, epoch = sender.next_seq()
        receiver.decrypt(seq, epoch, b"header", sender.encrypt(seq, epoch, b"header", payload))

    return frame


NATS_SECURE = "encrypted, NATS TLS + auth"  # what `mohawk up` runs
ENCRYPTED = "encrypted"  # NATS with neither TLS nor users
PLAINTEXT = "plaintext (--insecure)"
TLS_ONLY = "encrypted, NATS TLS, no users"


def end_to_end(form: Form) -> dict[str, Stat]:
    """Part 4: `mohawk up` as it runs, Mohawk's encryption on open NATS, and --insecure."""
    clusters: dict[str, dict[str, Any]] = {NATS_SECURE: {"nats_security": True}}
    if form.open_nats_encrypted:
        clusters[ENCRYPTED] = {"secure": True}
    clusters[PLAINTEXT] = {"secure": False}
    return side_by_side(form, clusters)


def identities(form: Form) -> dict[str, Stat]:
    """Part 5: `mohawk up`'s bus (a user per process, TLS) against the same with TLS and no users."""
    return side_by_side(
        form, {NATS_SECURE: {"nats_security": True}, TLS_ONLY: {"nats_security": True, "nats_users": False}}
    )


def side_by_side(form: Form, clusters: dict[str, dict[str, Any]]) -> dict[str, Stat]:
    """The same concurrent streams through each of `clusters` (name -> `ClusterSetup` options),
    in ABC-CBA order so drift hits all alike, after a warm-up of each."""
    qs = questions(form.num_concurrent)
    with tempfile.TemporaryDirectory(prefix="mohawk-sec-") as root:
        setups: dict[str, ClusterSetup] = {}
        try:
            for index, (name, options) in enumerate(clusters.items()):
                setups[name] = ClusterSetup(form.nodes, Path(root) / str(index), **options)
            runs: dict[str, list[float]] = {name: [] for name in setups}
            for setup in setups.values():  # warm-up: first batched shapes, channels, prefix cache
                setup.batch1(qs[0], 4)
                setup.concurrent(qs, 2)
            for repeat in range(form.repeats):
                order = list(setups.items())
                for name, setup in order if repeat % 2 == 0 else reversed(order):  # ABC-CBA: drift cancels
                    runs[name].append(setup.concurrent(qs, form.tokens))
        finally:
            for setup in setups.values():
                setup.close()
    return {name: Stat.of(values) for name, values in runs.items()}


def identities_report(e2e: dict[str, Stat], form: Form) -> str:
    users, tls = e2e[NATS_SECURE], e2e[TLS_ONLY]
    return "\n".join(
        [
            f"{form.nodes}-node cluster, {form.num_concurrent} concurrent streams × {form.tokens} tokens, "
            f"aggregate tokens/s, medians (min–max) of {form.repeats} run(s) each, in ABBA order:",
            "",
            "| bus | tokens/s | × TLS, no users |",
            "|---|---|---|",
            f"| {TLS_ONLY} | {tls} | 1.00 |",
            f"| {NATS_SECURE}: a user per process (mohawk up) | {users} | {users.median / tls.median:.3f} |",
        ]
    )


def report(micro_results: dict[str, Stat], e2e: dict[str, Stat], form: Form) -> str:
    lines = ["| operation | ms per call |", "|---|---|"]
    lines += [
        f"| {name} | {stat.median:.3f} ({stat.low:.3f}–{stat.high:.3f}) |"
        for name, stat in micro_results.items()
    ]
    if not e2e:
        return "\n".join(lines)
    nats, plain = e2e[NATS_SECURE], e2e[PLAINTEXT]
    secure = e2e.get(ENCRYPTED)
    lines += [
        "",
        f"{form.nodes}-node cluster, {form.num_concurrent} concurrent streams × {form.tokens} tokens, "
        f"aggregate tokens/s, medians (min–max) of {form.repeats} run(s) each, in ABC-CBA order:",
        "",
        "| bus | tokens/s | × plaintext | × encrypted, open NATS |",
        "|---|---|---|---|",
        f"| {PLAINTEXT}, open NATS | {plain} | 1.00 | |",
    ]
    if secure is not None:
        lines.append(f"| {ENCRYPTED}, open NATS | {secure} | {secure.median / plain.median:.3f} | 1.00 |")
    versus_secure = f"{nats.median / secure.median:.3f}" if secure is not None else "not run"
    lines.append(
        f"| {NATS_SECURE} (mohawk up) | {nats} | {nats.median / plain.median:.3f} | {versus_secure} |"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full form (make bench)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--micro-only", action="store_true", help="the per-operation costs alone, without the clusters"
    )
    parser.add_argument(
        "--identities",
        action="store_true",
        help="part 5 alone: a NATS user per process against TLS with no users (3-node clusters)",
    )
    args = parser.parse_args(argv)
    configure_logging("warning")
    form = FULL if args.full else SHORT
    if args.identities:
        form = FULL
        e2e = identities(form)
        table = identities_report(e2e, form)
        print(table)
        if args.json:
            data = {"form": form.__dict__, "end_to_end_tps": {k: v.__dict__ for k, v in e2e.items()}}
            write_results(args.json, data, table, argv)
        return 0
    with tempfile.TemporaryDirectory(prefix="mohawk-pki-") as pki:
        micro_results = micro(form, Path(pki))
    e2e = {} if args.micro_only else end_to_end(form)
    table = report(micro_results, e2e, form)
    print(table)
    if args.json:
        plain: dict[str, Any] = {
            "form": form.__dict__,
            "micro_ms": {k: v.__dict__ for k, v in micro_results.items()},
            "end_to_end_tps": {k: v.__dict__ for k, v in e2e.items()},
        }
        write_results(args.json, plain, table, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
