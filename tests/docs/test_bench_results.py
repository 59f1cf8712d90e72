"""The benchmark pages' hook renders a result file written by bench/results_file.py as a table
headed by its stamp, and fails the build on a marker with no file or a file with no stamp."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from mkdocs.exceptions import PluginError

from bench.results_file import ROOT, write_results
from docs_hooks.bench_results import render

TABLE = """engine benchmark (full form)

| | Mohawk | transformers |
|---|---|---|
| batch-1 decode, tokens/s | 76.0 (65.5–79.2) | 16.6 (14.0–18.2) |"""


@pytest.fixture
def results_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A results folder holding one run of bench/engine.py, saved as `make bench` saves it."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "engine.py"), "--full", "--json", "out.json"])
    write_results(tmp_path / "engine-cpu.json", {"ratios": {"decode": 4.58}}, TABLE)
    return tmp_path


def test_a_marker_becomes_the_table_headed_by_its_stamp(results_dir: Path) -> None:
    page = render("# Benchmarks\n\n<!-- results: engine-cpu -->\n\nAfter.\n", results_dir)
    stamp = json.loads((results_dir / "engine-cpu.json").read_text())["stamp"]
    heading, table = page.split("| | Mohawk | transformers |")
    assert "Printed by `python bench/engine.py --full --json out.json`" in heading
    assert f"at commit `{stamp['commit']['hash']}`" in heading
    assert stamp["machine"]["cpu"] in heading and f"{stamp['machine']['cores']} cores" in heading
    assert stamp["date"][:10] in heading and heading.rstrip().endswith("engine benchmark (full form)")
    assert "| batch-1 decode, tokens/s | 76.0 (65.5–79.2) | 16.6 (14.0–18.2) |" in table
    assert "<!--" not in page and page.endswith("After.\n")
    quoted = "Write `<!-- results: engine-cpu -->` on a line of its own."
    assert render(quoted, results_dir) == quoted  # only a marker alone on its line is replaced


def test_the_star_marker_renders_every_saved_file_under_its_name(results_dir: Path, tmp_path: Path) -> None:
    write_results(results_dir / "scaleout-cpu.json", {"x": 1.5})
    page = render("<!-- results: * -->", results_dir)
    assert page.index("### engine-cpu") < page.index("### scaleout-cpu")
    assert "| figure | value |" in page and "| x | 1.5 |" in page  # no table printed: its figures
    empty = tmp_path / "empty"
    empty.mkdir()
    assert render("<!-- results: * -->", empty) == "No run has been saved in `bench/results/` yet."


def test_a_missing_or_unstamped_result_fails_the_build(results_dir: Path) -> None:
    with pytest.raises(PluginError, match="not there"):
        render("<!-- results: distributed-cpu -->", results_dir)
    (results_dir / "old.json").write_text(json.dumps({"results": {}}))
    with pytest.raises(PluginError, match="no stamp"):
        render("<!-- results: old -->", results_dir)


def test_the_site_runs_the_hook() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "docs_hooks/bench_results.py" in config["hooks"]


def test_a_copy_checked_against_a_commits_tree_is_stamped_with_that_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU machine runs a copy of the files under an older git history; its runner names the commit
    (after the files' tree hash matched it), and the stamp says so instead of 'uncommitted changes'."""
    monkeypatch.setenv("MOHAWK_RESULTS_COMMIT", "a632e38")
    write_results(tmp_path / "copied.json", {"x": 1})
    commit = json.loads((tmp_path / "copied.json").read_text())["stamp"]["commit"]
    assert commit == {"hash": "a632e38", "dirty": False, "matched": "tree hash"}


def test_a_run_from_a_dirty_tree_is_refused_in_bench_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/results/ holds only runs a commit can reproduce: a dirty (or unknown) tree is refused
    there and nothing is written; elsewhere the run is written, stamped dirty."""
    import bench.results_file as results_file

    monkeypatch.setattr(results_file, "RESULTS_DIR", tmp_path / "results")
    for dirty in (True, None):
        monkeypatch.setattr(results_file, "commit", lambda dirty=dirty: {"hash": "abc1234", "dirty": dirty})
        with pytest.raises(results_file.DirtyTreeError, match="uncommitted changes"):
            write_results(tmp_path / "results" / "engine-cpu.json", {"x": 1})
        assert not (tmp_path / "results").exists()
    write_results(tmp_path / "elsewhere.json", {"x": 1})
    assert json.loads((tmp_path / "elsewhere.json").read_text())["stamp"]["commit"]["dirty"] is None
    monkeypatch.setattr(results_file, "commit", lambda: {"hash": "abc1234", "dirty": False})
    write_results(tmp_path / "results" / "engine-cpu.json", {"x": 1})
    assert (tmp_path / "results" / "engine-cpu.json").is_file()
