# qpnserve on a V100 host image for 4x Tesla V100 (sm_70), with either kind of host:
#
#   native route (default): ReVolta from the registry, which carries the route itself
#     docker build -t qpnserve .                                  # HOST=revolta==0.1.4
#   patched route: your 1Cat-vLLM v1.3.0 wheel (not on the registry), put in the build context
#     docker build --build-arg HOST_WHEEL=1cat_vllm-1.3.0-cp312-cp312-linux_x86_64.whl -t qpnserve .
#
# Run (the checkpoint is mounted, never baked in; the state dir holds logs, route reports, benches):
#   docker run --gpus all --ipc=host -p 8000:8000 -v /models:/models:ro -v qpnserve-state:/state \
#     qpnserve up --awq-m1 --model /models/Qwen3.8-AWQ --host 0.0.0.0
#
# Why these pieces: CUDA 12.8 is the newest toolkit line that still targets sm_70 (CUDA 13
# dropped Volta), and it matches both hosts' torch 2.10.0+cu128; Ubuntu 24.04 ships the Python
# 3.12 that both hosts' wheels are built for. torch comes from the cu128 index first, so the host
# install cannot pull a torch built for another CUDA. A patched host needs qpnserve's operator:
# it is compiled for sm_70 at image build time (no GPU is needed to compile), so `up` only loads
# it; a native host ships its own op and skips that step.
# NOT BUILT OR RUN here: qpnserve's CI machine has no Docker engine, no GPU, and cannot pull the
# base image, so this file is checked by reading only.
FROM nvidia/cuda:12.8.1-devel-ubuntu24.04

# HOST: a requirement installed from the registry; HOST_WHEEL: a wheel file in the build context
# that replaces it (the patched route's 1Cat-vLLM wheel).
ARG HOST=revolta==0.1.4
ARG HOST_WHEEL=
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

# The host first, with the torch, torchaudio and torchvision that revolta 0.1.4 pins exactly.
# The Dockerfile is copied along only so that the wildcard matches when no wheel is given.
COPY Dockerfile *.whl /tmp/host/
# DL3013 cannot see through the build arguments: HOST defaults to the exact pin revolta==0.1.4,
# and HOST_WHEEL is a file.
# hadolint ignore=DL3013
RUN pip install torch==2.10.0 torchaudio==2.10.0 torchvision==0.25.0 \
      --index-url https://download.pytorch.org/whl/cu128 \
 && if [ -n "${HOST_WHEEL}" ]; then pip install "/tmp/host/${HOST_WHEEL}"; \
    else pip install "${HOST}"; fi \
 && rm -rf /tmp/host

WORKDIR /opt/qpnserve/src
COPY pyproject.toml README.md ./
COPY qpnserve ./qpnserve
COPY csrc ./csrc
COPY patches ./patches
RUN pip install . ninja \
 && if [ -n "${HOST_WHEEL}" ]; then qpnserve build --arch 7.0; fi

# The server must run outside any source checkout (the host's own instructions).
WORKDIR /state
ENTRYPOINT ["qpnserve"]
CMD ["check"]
