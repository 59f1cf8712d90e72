"""The shard bounds torch's CPU kernel caches unless the operator's environment already does."""

from __future__ import annotations

from mohawk_shard.native_caches import NATIVE_CACHE_LIMITS, bound_native_caches


def test_unset_limits_are_bounded() -> None:
    environ: dict[str, str] = {"PATH": "/usr/bin"}
    chosen = bound_native_caches(environ)
    assert chosen == NATIVE_CACHE_LIMITS
    assert environ == {"PATH": "/usr/bin", **NATIVE_CACHE_LIMITS}
    assert all(int(value) > 0 for value in chosen.values())


def test_an_operators_setting_wins() -> None:
    environ = {"LRU_CACHE_CAPACITY": "1024"}
    chosen = bound_native_caches(environ)
    assert environ["LRU_CACHE_CAPACITY"] == "1024"
    assert "LRU_CACHE_CAPACITY" not in chosen
    onednn = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
    assert environ[onednn] == NATIVE_CACHE_LIMITS[onednn]
