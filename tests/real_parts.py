"""The real parts some tests need (redis-server, Chromium, liboqs), and what a test does when one is
missing: it fails, saying how to install it, unless `make test` was told to skip that part's tests
(`MOHAWK_SKIP_MISSING=redis-server,chromium,liboqs`, comma-separated). A green suite on a machine
without Redis used to mean eleven files of tenant, session and rate-limit tests had quietly not
run; now it means they ran, or that someone chose to skip them by name.

`make setup` installs redis-server and chromium where it can (Debian, as root); liboqs is a C
library released on GitHub, not on PyPI, which is all `make setup` fetches from, so `make test`
skips its interop tests by name unless `OQS_INSTALL_PATH` names a build (README, Development).
"""

from __future__ import annotations

import os

import pytest

SKIP_ENV = "MOHAWK_SKIP_MISSING"
INSTALL = {
    "redis-server": "apt-get install -y redis-server (make setup does, as root on Debian)",
    "chromium": "apt-get install -y chromium (make setup does, as root on Debian; Playwright's own "
    "browser download cannot work here)",
    "liboqs": "build liboqs and set OQS_INSTALL_PATH (docs/development.md)",
    "playwright": "pip install playwright (the dev extra has it)",
}


def skipped_parts() -> set[str]:
    """The parts whose tests `make test` was told to skip."""
    return {part.strip() for part in os.environ.get(SKIP_ENV, "").split(",") if part.strip()}


def missing(part: str, detail: str = "") -> None:
    """Stop the current test for want of `part`: a skip where it was asked for by name, else a
    failure that says how to install it. Never returns."""
    what = f"{part} is missing{f' ({detail})' if detail else ''}: {INSTALL[part]}"
    if part in skipped_parts():
        pytest.skip(f"{what}; skipped as {SKIP_ENV} asks")
    pytest.fail(f"{what}; or set {SKIP_ENV}={part} to skip the tests that need it", pytrace=False)
