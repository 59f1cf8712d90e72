"""The one base exception of libs/pqc, and the one exception every authentication failure raises."""

from __future__ import annotations

from typing import Literal

from mohawk_common.errors import MohawkError

RejectReason = Literal[
    "tampered",  # AEAD tag or signature does not verify
    "replayed",  # a sequence number already seen, or older than the replay window
    "unknown_channel",  # no handshake established this channel (or it belongs to another plan)
    "untrusted",  # certificate not issued by our root, or for another role / node than expected
    "revoked",  # certificate serial on the revocation list
    "expired",  # certificate outside its validity
    "downgrade",  # the peer did not offer the hybrid suite (no ML-KEM)
    "plaintext",  # a plaintext message where this node requires encryption
    "bad_digest",  # slice weights do not hash to what the signed manifest says
    "bad_version",  # slice format, model, revision or layer range other than the one asked for
    "malformed",  # bytes that do not parse as the expected message
    "unsigned",  # a control record (plan, heartbeat) without the signature this node requires
    "overloaded",  # a bounded table (handshakes awaiting their finish) is full
    "out_of_position",  # a channel or frame kind between stages the pipeline does not link that way
    "stale",  # a request past its deadline, or re-published after the stream's duplicate window
]

REJECT_REASONS: tuple[str, ...] = RejectReason.__args__  # type: ignore[attr-defined]


class PqcError(MohawkError):
    """Base of every error libs/pqc raises on purpose."""


class AuthenticationError(PqcError):
    """Something failed to authenticate. One type for every cause, so callers cannot become an oracle;
    `reason` is for this process's own logs and metrics and never goes back to the peer."""

    def __init__(self, reason: RejectReason, detail: str = "") -> None:
        super().__init__(f"authentication failed ({reason}){': ' + detail if detail else ''}")
        self.reason: RejectReason = reason
        self.detail = detail


class PkiError(PqcError):
    """A PKI file is missing or unusable (operator-side problems, not attacks)."""
