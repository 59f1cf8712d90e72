"""Every subject, stream, consumer, KV bucket and key Mohawk uses; nothing else spells them.

Subjects are `mohawk.v1.<entity>.<id>`, lowercase, one token per id, so `nats sub 'mohawk.v1.>'`
shows the whole system and each entity can be filtered with one wildcard:

    mohawk.v1.req.<model>             requests (JetStream stream MOHAWK_REQUESTS, work queue)
    mohawk.v1.tok.<request>           token events (JetStream stream MOHAWK_TOKENS, kept briefly)
    mohawk.v1.act.<plan>.<stage>      activation frames into stage <stage> of plan version <plan>;
                                      stage 0 receives the last stage's step results here (core NATS)
    mohawk.v1.hb.<node>               node heartbeats, JSON (core NATS)
    mohawk.v1.cancel.<request>        cancel a request (core NATS; a tag only the request's key makes)
    mohawk.v1.hs.<node>               channel handshakes with <node> (core NATS request/reply)

KV buckets: mohawk_leader (the coordinator lease), mohawk_nodes (live registry, TTL),
mohawk_plan (the versioned placement plan under key `current`), mohawk_pki (the root-signed
revocation list under key `crl`). Object store: mohawk_slices (signed, encrypted slice packages).
"""

from __future__ import annotations

import re

PREFIX = "mohawk.v1"

REQUESTS_STREAM = "MOHAWK_REQUESTS"
TOKENS_STREAM = "MOHAWK_TOKENS"
REQUESTS_WILDCARD = f"{PREFIX}.req.>"
TOKENS_WILDCARD = f"{PREFIX}.tok.>"
HEARTBEAT_WILDCARD = f"{PREFIX}.hb.*"
CANCEL_WILDCARD = f"{PREFIX}.cancel.*"

LEADER_BUCKET = "mohawk_leader"
LEADER_KEY = "coordinator"
NODES_BUCKET = "mohawk_nodes"
PLAN_BUCKET = "mohawk_plan"
PLAN_KEY = "current"
PKI_BUCKET = "mohawk_pki"
GATEWAYS_BUCKET = "mohawk_gateways"  # key: a gateway process; kept alive while it runs (TTL)
CRL_KEY = "crl"
SLICES_BUCKET = "mohawk_slices"

_TOKEN_RE = re.compile(r"[^a-z0-9_-]+")
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def subject_token(name: str) -> str:
    """`name` as one subject token (and KV key/consumer name): lowercase, [a-z0-9_-], others as '-'."""
    token = _TOKEN_RE.sub("-", name.lower()).strip("-")
    if not token:
        raise ValueError(f"{name!r} has no character usable in a subject")
    return token


def check_id(kind: str, value: str) -> str:
    """Ids that go into subjects verbatim (request ids, node ids) must be one safe token."""
    if not _ID_RE.match(value):
        raise ValueError(f"{kind} {value!r} must be 1-128 characters of [A-Za-z0-9_-]")
    return value


def request_subject(model: str) -> str:
    return f"{PREFIX}.req.{subject_token(model)}"


def token_subject(request_id: str) -> str:
    return f"{PREFIX}.tok.{check_id('request id', request_id)}"


def cancel_subject(request_id: str) -> str:
    return f"{PREFIX}.cancel.{check_id('request id', request_id)}"


def activation_subject(plan_version: int, stage: int) -> str:
    return f"{PREFIX}.act.{int(plan_version)}.{int(stage)}"


def heartbeat_subject(node_id: str) -> str:
    return f"{PREFIX}.hb.{check_id('node id', node_id)}"


def stage0_consumer(model: str) -> str:
    """The durable pull consumer stage-0 nodes of `model` share on MOHAWK_REQUESTS."""
    return f"stage0-{subject_token(model)}"


def handshake_subject(node_id: str) -> str:
    return f"{PREFIX}.hs.{check_id('node id', node_id)}"


def slice_object_name(model: str, node_id: str) -> str:
    """The object in SLICES_BUCKET that holds `node_id`'s slice package of `model`."""
    return f"{subject_token(model)}/{check_id('node id', node_id)}"
