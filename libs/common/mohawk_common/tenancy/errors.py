"""The errors of tenancy: one base, and the kinds a caller tells apart."""

from __future__ import annotations

from mohawk_common.errors import MohawkError


class TenancyError(MohawkError):
    """Base of tenancy's errors: a bad name or limit, an unknown or duplicate tenant."""


class TenantNotFound(TenancyError):
    """No tenant of that name."""


class TenantExists(TenancyError):
    """A tenant of that name already exists."""


class TenancyUnavailable(TenancyError):
    """Redis cannot be reached and nothing this process remembers answers the question."""
