"""A test missing a real part fails, saying how to install it, unless MOHAWK_SKIP_MISSING names it."""

from __future__ import annotations

import pytest

from tests.real_parts import SKIP_ENV, missing


def test_a_missing_part_fails_with_its_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SKIP_ENV, "chromium")  # another part's skip does not cover this one
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y redis-server") as caught:
        missing("redis-server")
    assert f"{SKIP_ENV}=redis-server" in str(caught.value)


def test_a_part_named_to_skip_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SKIP_ENV, " chromium, liboqs ")
    with pytest.raises(pytest.skip.Exception, match="liboqs is missing"):
        missing("liboqs", "no OQS_INSTALL_PATH")
