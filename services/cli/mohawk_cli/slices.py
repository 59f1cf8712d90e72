"""`mohawk slice pack|push`: an operator builds a node's signed, encrypted slice package and ships it.

    mohawk slice pack --model M.gguf --start 0 --end 10 --node-id shard-1 --out slices/shard-1
    mohawk slice push --package slices/shard-1 --nats-url nats://127.0.0.1:4222

`pack` reads the layer range (plus config and tokenizer) from local model files, signs the
manifest with the root key of --pki-dir and seals the weights to the node's certificate there.
`push` puts the package into the slices object store, where that node fetches it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nats.errors import Error as NatsError

from mohawk_common.bus.config import DEFAULT_NATS_URL
from mohawk_common.errors import MohawkError
from mohawk_common.logging import LEVELS, configure_logging

if TYPE_CHECKING:
    from mohawk_pqc.slices import SlicePackage
    from mohawk_proto.v1.security_pb2 import Certificate

DEFAULT_PKI_DIR = ".mohawk/pki"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="slice_command", required=True)
    pack = commands.add_parser("pack", help="build one node's slice package from local model files")
    pack.add_argument("--model", help="GGUF file or safetensors directory (default: bundled SmolLM2-135M)")
    pack.add_argument("--start", type=int, required=True, help="first layer of the slice")
    pack.add_argument("--end", type=int, required=True, help="one past the last layer of the slice")
    pack.add_argument("--node-id", required=True, help="the receiving shard node (its certificate seals it)")
    pack.add_argument("--pki-dir", default=DEFAULT_PKI_DIR, help=f"operator PKI (default {DEFAULT_PKI_DIR})")
    pack.add_argument("--policy-tag", action="append", default=[], help="policy tag (repeatable)")
    pack.add_argument("--revision", help="model revision nodes may insist on (default: a fingerprint)")
    pack.add_argument("--served-model", help="the model's name in the API (default: from the file)")
    pack.add_argument("--out", required=True, help="directory to write the package to")
    push = commands.add_parser("push", help="put a slice package into the NATS object store")
    push.add_argument("--package", required=True, help="a directory written by `mohawk slice pack`")
    push.add_argument(
        "--nats-url",
        default=os.environ.get("MOHAWK_NATS_URL", DEFAULT_NATS_URL),
        help="NATS server URL(s), comma-separated (default: $MOHAWK_NATS_URL or 127.0.0.1:4222)",
    )
    push.add_argument(
        "--creds",
        type=Path,
        help="NATS credential of the admin role (default: MOHAWK_NATS_CREDS; none: anonymous)",
    )
    push.add_argument("--replicas", type=int, default=1, help="replicas of the bucket if it is created")
    for sub in (pack, push):
        sub.add_argument("--log-level", default="error", choices=LEVELS, help="on stderr (default: error)")


def run(args: argparse.Namespace) -> int:
    """One line on stdout on success; one line on stderr and exit 2 on any error."""
    configure_logging(args.log_level, json=False)
    try:
        line = run_pack(args) if args.slice_command == "pack" else run_push(args)
    except (MohawkError, ConnectionError, NatsError, OSError, ValueError) as exc:
        print(f"mohawk slice {args.slice_command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(line)
    return 0


def run_pack(args: argparse.Namespace) -> str:
    from mohawk_common.bus.config import served_model_name
    from mohawk_common.bus.names import check_id
    from mohawk_common.model_store import open_model
    from mohawk_common.model_store.slice_source import model_fingerprint, slice_weights
    from mohawk_pqc.pki_files import load_root_key
    from mohawk_pqc.slices import pack_slice

    check_id("node id", args.node_id)
    pki = Path(args.pki_dir)
    root_key = load_root_key(pki)
    cert = _read_certificate(pki / "nodes" / args.node_id / "node.cert")
    source = open_model(args.model)
    fields, weights = slice_weights(source, args.start, args.end)
    fields["model_revision"] = args.revision or model_fingerprint(source)
    fields["served_model"] = served_model_name(args.model, args.served_model)
    fields["policy_tags"] = list(args.policy_tag)
    package = pack_slice(root_key, cert, fields, weights)
    out = Path(args.out)
    package.write(out)
    return (
        f"wrote {out}: layers [{args.start}, {args.end}) of {fields['served_model']} "
        f"(revision {fields['model_revision']}) for {args.node_id}, "
        f"{len(package.sealed_weights_bytes) / 2**20:.1f} MiB sealed"
    )


def run_push(args: argparse.Namespace) -> str:
    from mohawk_common.bus.names import SLICES_BUCKET
    from mohawk_common.model_store.slice_fetch import package_object_name
    from mohawk_pqc.slices import SlicePackage

    package = SlicePackage.read(Path(args.package))
    name = package_object_name(package)  # a broken package fails before any connection
    asyncio.run(_push(args.nats_url, package, args.replicas, args.creds))
    return f"pushed {args.package} to {SLICES_BUCKET}/{name}"


async def _push(nats_url: str, package: SlicePackage, replicas: int, creds: Path | None = None) -> str:
    from mohawk_common.bus.connect import connect
    from mohawk_common.model_store.slice_fetch import push_slice

    servers = [u.strip() for u in nats_url.split(",") if u.strip()]
    nc = await connect(servers, name="mohawk-slice-push", attempts=1, creds=creds)
    try:
        return await push_slice(nc.jetstream(), package, replicas=replicas)
    finally:
        await nc.close()


def _read_certificate(path: Path) -> Certificate:
    from google.protobuf.message import DecodeError

    from mohawk_pqc.errors import PkiError
    from mohawk_proto.v1 import security_pb2

    try:
        return security_pb2.Certificate.FromString(path.read_bytes())
    except FileNotFoundError as exc:
        raise PkiError(f"{path} is missing (issue the node first: mohawk pki issue)") from exc
    except DecodeError as exc:
        raise PkiError(f"{path} is not a certificate") from exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
