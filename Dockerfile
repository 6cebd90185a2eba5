# qpnserve on a 1Cat-vLLM host image for 4x Tesla V100 (sm_70).
#
# Build (the 1Cat-vLLM wheel is yours to supply: it is not on PyPI; put it in the build context):
#   docker build --build-arg HOST_WHEEL=1cat_vllm-<version>-cp312-cp312-linux_x86_64.whl -t qpnserve .
# Run (the checkpoint is mounted, never baked in; the state dir holds logs, route reports, benches):
#   docker run --gpus all --ipc=host -p 8000:8000 -v /models:/models:ro -v qpnserve-state:/state \
#     qpnserve up --awq-m1 --model /models/Qwen3.8-AWQ --host 0.0.0.0
#
# Why these pieces: CUDA 12.8 is the newest toolkit line that still targets sm_70 (CUDA 13
# dropped Volta), and it matches the host's torch 2.10.0+cu128 wheels; Ubuntu 24.04 ships the
# Python 3.12 that the host's wheels are built for. The operator is compiled for sm_70 at image
# build time (no GPU is needed to compile), so `up` only loads it.
# Not built or run in qpnserve's CI (that machine has no Docker engine and no GPU).
FROM nvidia/cuda:12.8.1-devel-ubuntu24.04

ARG HOST_WHEEL
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    QPNSERVE_STATE_DIR=/state \
    QPNSERVE_BUILD_DIR=/opt/qpnserve/extensions \
    CUDA_HOME=/usr/local/cuda \
    TORCH_CUDA_ARCH_LIST=7.0

# Not pinned (DL3008): the image builds on the CUDA base's Ubuntu 24.04 and takes that release's
# current python3 and git; an exact pin breaks the build as soon as a security update replaces
# the pinned version in the archive. The host's own wheels pin what matters (torch, CUDA).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# The host first, with the torch it pins (torch 2.10.0+cu128 for the 1.3.x line).
COPY ${HOST_WHEEL} /tmp/
RUN pip install "/tmp/${HOST_WHEEL}" && rm -f "/tmp/${HOST_WHEEL}"

WORKDIR /opt/qpnserve/src
COPY pyproject.toml README.md ./
COPY qpnserve ./qpnserve
COPY csrc ./csrc
COPY patches ./patches
RUN pip install . ninja \
 && qpnserve build --arch 7.0

# The server must run outside any source checkout (the host's own instructions).
WORKDIR /state
ENTRYPOINT ["qpnserve"]
CMD ["check"]
