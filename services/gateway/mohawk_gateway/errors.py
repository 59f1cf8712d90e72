"""`GatewayError`: every failure the gateway answers on purpose, with its HTTP status and OpenAI body.

A message is shown to the client as written, so it never carries an exception's own text: a NATS or
Redis error names hosts, ports and sometimes credentials. `unavailable_after` answers such a failure
with what failed, in words fit for a client, and logs the exception's text (the detail the
operator needs) once, at warning.
"""

from __future__ import annotations

from typing import Any, Literal

import structlog

from mohawk_common.errors import MohawkError

log = structlog.get_logger("mohawk.gateway")

_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout",
}


def error_type(status: int) -> str:
    """OpenAI's `error.type` for a status: invalid_request_error for 4xx, server_error for 5xx."""
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


class GatewayError(MohawkError):
    """A request ends with `status` and an OpenAI error body; the message is fit to show the client."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`, as OpenAI writes it."""
        return {
            "error": {
                "message": self.message,
                "type": error_type(self.status),
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def unavailable(reason: str, retry_after_s: int) -> GatewayError:
    return GatewayError(503, reason, code="service_unavailable", headers=_retry_after(retry_after_s))


def unavailable_after(what: str, exc: BaseException, retry_after_s: int, **context: Any) -> GatewayError:
    """503 saying `what` failed, with no detail of `exc`; the detail goes to the log only."""
    log.warning(what, error=str(exc) or type(exc).__name__, error_type=type(exc).__name__, **context)
    return unavailable(f"{what}; retry later", retry_after_s)


RefusalReason = Literal[
    "gateway_full", "queue_full", "tenant_rate_limit", "over_tenant_window", "ttft_objective"
]
REFUSAL_HEADER = "X-Mohawk-Refusal"  # which of RefusalReason a 429 is


def too_many_requests(
    reason: RefusalReason,
    message: str,
    *,
    retry_after_s: int | None = None,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> GatewayError:
    """Every 429 the gateway answers, from here: OpenAI's `rate_limit_exceeded` with `reason` in
    the X-Mohawk-Refusal header (gateway_full: no room for another request in flight; queue_full:
    the request stream is at its bounds; tenant_rate_limit: the tenant's rpm, tpm or concurrency;
    over_tenant_window: more tokens than a whole minute of the tenant's allows; ttft_objective: the
    request's first token is predicted later than its objective, `wait_estimate.py`)."""
    all_headers = {**(headers or {}), REFUSAL_HEADER: reason}
    if retry_after_s is not None:
        all_headers.update(_retry_after(retry_after_s))
    return GatewayError(429, message, param=param, code="rate_limit_exceeded", headers=all_headers)


def _retry_after(seconds: int) -> dict[str, str]:
    return {"Retry-After": str(seconds)}
