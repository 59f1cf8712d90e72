"""A node never loads a slice package older than the newest it has loaded (`SliceHighWater`): the
mark survives a restart (a new object on the same state dir), a rollback to an older signed
package is refused `replayed` whatever revision it names, the same package again is fine, and a
mangled mark file is counted from nothing rather than stopping the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from mohawk_pqc.errors import AuthenticationError
from mohawk_shard.node.slice_high_water import FILE_NAME, SliceHighWater

MODEL = "smollm2-135m-instruct"


def manifest(created: float, revision: str) -> dict[str, object]:
    return {"created": created, "model_revision": revision, "served_model": MODEL}


def test_an_older_package_is_refused_after_a_newer_one_even_across_a_restart(tmp_path: Path) -> None:
    marks = SliceHighWater(tmp_path)
    marks.check(MODEL, manifest(100.0, "r1"))  # nothing loaded yet: anything signed goes
    marks.accept(MODEL, manifest(100.0, "r1"))
    marks.check(MODEL, manifest(200.0, "r2"))
    marks.accept(MODEL, manifest(200.0, "r2"))
    restarted = SliceHighWater(tmp_path)
    restarted.check(MODEL, manifest(200.0, "r2"))  # the same package, loaded again after a restart
    for old in (manifest(100.0, "r1"), manifest(150.0, "r3")):  # older, whatever it calls itself
        with pytest.raises(AuthenticationError) as caught:
            restarted.check(MODEL, old)
        assert caught.value.reason == "replayed" and "r2" in caught.value.detail
    restarted.check("another-model", manifest(1.0, "x"))  # each model has its own mark
    restarted.accept(MODEL, manifest(150.0, "r3"))  # never lowers the mark
    with pytest.raises(AuthenticationError):
        SliceHighWater(tmp_path).check(MODEL, manifest(199.0, "r4"))


def test_a_manifest_without_a_packing_time_is_malformed(tmp_path: Path) -> None:
    for created in (None, "200", True):
        with pytest.raises(AuthenticationError) as caught:
            SliceHighWater(tmp_path).check(MODEL, {"created": created})
        assert caught.value.reason == "malformed"


@pytest.mark.parametrize("text", ["not json", "[]", '{"m": {"created": "late"}}'])
def test_a_mangled_mark_is_counted_from_nothing(tmp_path: Path, text: str) -> None:
    (tmp_path / FILE_NAME).write_text(text)
    marks = SliceHighWater(tmp_path)
    marks.check(MODEL, manifest(5.0, "r1"))
    marks.accept(MODEL, manifest(5.0, "r1"))
    with pytest.raises(AuthenticationError):
        SliceHighWater(tmp_path).check(MODEL, manifest(4.0, "r0"))
