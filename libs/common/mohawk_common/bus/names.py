"""Every subject, stream, consumer, KV bucket and key Mohawk uses; nothing else spells them.

Subjects are `mohawk.v1.<entity>.<id>`, lowercase, one token per id, so `nats sub 'mohawk.v1.>'`
shows the whole system and each entity can be filtered with one wildcard:

    mohawk.v1.req.<model>             requests (JetStream stream MOHAWK_REQUESTS, work queue) for
                                      whichever pipeline has room first
    mohawk.v1.req.<model>.p<id>       requests routed to pipeline <id> (round robin, prefix affinity)
    mohawk.v1.tok.<request>           token events (JetStream stream MOHAWK_TOKENS, kept briefly)
    mohawk.v1.act.<node>.<epoch>.<pipeline>.<stage>
                                      activation frames into stage <stage> of pipeline <pipeline>,
                                      formed by plan version <epoch>, served by node <node> (only
                                      its bus user may subscribe); stage 0 receives the last
                                      stage's step results here (core NATS)
    mohawk.v1.hb.<node>               node heartbeats, JSON (core NATS)
    mohawk.v1.cancel.<request>        cancel a request (core NATS; a tag only the request's key makes)
    mohawk.v1.hs.<node>.<from>        channel handshakes <from> offers <node> (core NATS
                                      request/reply)

KV buckets: mohawk_leader (the coordinator lease), mohawk_nodes (live registry, TTL),
mohawk_plan (the versioned placement plan under key `current`), mohawk_pki (the root-signed
revocation list under key `crl`, each model's newest root-signed sealing-key record under
`seal.<model>`). Object store: mohawk_slices (signed, encrypted slice packages).
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
TELEMETRY_WILDCARD = f"{PREFIX}.tel.>"

LEADER_BUCKET = "mohawk_leader"
LEADER_KEY = "coordinator"
NODES_BUCKET = "mohawk_nodes"
PLAN_BUCKET = "mohawk_plan"
PLAN_KEY = "current"
PKI_BUCKET = "mohawk_pki"
GATEWAYS_BUCKET = "mohawk_gateways"  # key: a gateway process; kept alive while it runs (TTL)
CRL_KEY = "crl"
SEAL_KEY_PREFIX = "seal."  # + a model's subject token: its sealing-key record in PKI_BUCKET
PKI_WILDCARD = ">"  # every key of PKI_BUCKET
SLICES_BUCKET = "mohawk_slices"

_TOKEN_RE = re.compile(r"[^a-z0-9_-]+")
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def subject_token(name: str) -> str:
    """`name` as one subject token (and KV key/consumer name): lowercase, [a-z0-9_-], others as '-'."""
    token = _TOKEN_RE.sub("-", name.lower()).strip("-")
    if not token:
        raise ValueError(f"{name!r} has no character usable in a subject")
    return token


def same_model(a: str, b: str) -> bool:
    """Whether two model names are one model on the bus (they map to the same subject token)."""
    return subject_token(a) == subject_token(b)


def check_id(kind: str, value: str) -> str:
    """Ids that go into subjects verbatim (request ids, node ids) must be one safe token."""
    if not _ID_RE.match(value):
        raise ValueError(f"{kind} {value!r} must be 1-128 characters of [A-Za-z0-9_-]")
    return value


def request_subject(model: str, route: int | None = None) -> str:
    """Requests of `model` for any pipeline (None) or routed to pipeline `route`."""
    base = f"{PREFIX}.req.{subject_token(model)}"
    return base if route is None else f"{base}.p{int(route)}"


def is_request_ack_subject(subject: str) -> bool:
    """Whether `subject` is a JetStream ack subject of a message of the requests stream (what a
    stage 0 lists as held, and the only kind of subject the leader may nak for it)."""
    tokens = subject.split(".")
    # $JS.ACK.<stream>.<consumer>... or, from newer servers, $JS.ACK.<domain>.<account>.<stream>...
    return (
        tokens[:2] == ["$JS", "ACK"] and REQUESTS_STREAM in (tokens[2:3] + tokens[4:5]) and " " not in subject
    )


def token_subject(request_id: str) -> str:
    return f"{PREFIX}.tok.{check_id('request id', request_id)}"


def cancel_subject(request_id: str) -> str:
    return f"{PREFIX}.cancel.{check_id('request id', request_id)}"


def activation_subject(node_id: str, epoch: int, pipeline: int, stage: int) -> str:
    """Frames into stage `stage` of `pipeline` (plan version `epoch`), which node `node_id` serves."""
    return f"{PREFIX}.act.{check_id('node id', node_id)}.{int(epoch)}.{int(pipeline)}.{int(stage)}"


def activations_to(node_id: str) -> str:
    """Every activation subject of `node_id` (what its bus user may subscribe to)."""
    return f"{PREFIX}.act.{check_id('node id', node_id)}.>"


def heartbeat_subject(node_id: str) -> str:
    return f"{PREFIX}.hb.{check_id('node id', node_id)}"


def stage0_consumer(model: str, route: int | None = None) -> str:
    """The durable pull consumer stage-0 nodes of `model` share on MOHAWK_REQUESTS (None), or the
    one of the requests routed to pipeline `route`."""
    base = f"stage0-{subject_token(model)}"
    return base if route is None else f"{base}-p{int(route)}"


def route_of_consumer(model: str, consumer: str) -> int | None:
    """The pipeline a `stage0_consumer(model, route)` name routes to; None for any other name."""
    prefix = f"{stage0_consumer(model)}-p"
    tail = consumer[len(prefix) :] if consumer.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def telemetry_subject(kind: str, process_id: str) -> str:
    """Where a process publishes its `mohawk_common.telemetry` reports of `kind` (step, req)."""
    return f"{PREFIX}.tel.{kind}.{check_id('process id', process_id)}"


def handshake_subject(responder: str, initiator: str) -> str:
    """Where `initiator` offers a channel handshake to `responder` (request/reply): the server lets
    only `initiator`'s user publish here and only `responder`'s subscribe."""
    return f"{PREFIX}.hs.{check_id('node id', responder)}.{check_id('node id', initiator)}"


def handshakes_to(node_id: str) -> str:
    """Every handshake offered to `node_id` (what it subscribes to)."""
    return f"{PREFIX}.hs.{check_id('node id', node_id)}.*"


def handshakes_from(node_id: str) -> str:
    """Every handshake `node_id` may offer (its user's publish permission)."""
    return f"{PREFIX}.hs.*.{check_id('node id', node_id)}"


def initiator_of(subject: str) -> str | None:
    """The offering node of a `handshake_subject`, None for any other subject."""
    tokens = subject.split(".")
    return tokens[4] if len(tokens) == 5 and tokens[2] == "hs" else None


def telemetry_of(process_id: str) -> str:
    """Every telemetry subject of `process_id` (its user's publish permission)."""
    return f"{PREFIX}.tel.*.{check_id('process id', process_id)}"


def gateway_presence_key(gateway_id: str, instance: str) -> str:
    """The key in GATEWAYS_BUCKET of one run (`instance`) of gateway `gateway_id`."""
    return f"{check_id('gateway id', gateway_id)}.{check_id('gateway instance', instance)}"


def presence_keys_of(gateway_id: str) -> str:
    """Every presence key gateway `gateway_id` may write (its user's publish permission)."""
    return f"{check_id('gateway id', gateway_id)}.*"


def seal_key_record_key(model: str) -> str:
    """The key in PKI_BUCKET of `model`'s newest sealing-key record (its request-sealing key)."""
    return f"{SEAL_KEY_PREFIX}{subject_token(model)}"


def slice_object_name(model: str, node_id: str) -> str:
    """The object in SLICES_BUCKET that holds `node_id`'s slice package of `model`."""
    return f"{subject_token(model)}/{check_id('node id', node_id)}"
