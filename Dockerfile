# Two targets:
#   docker build --target cpu  -t pactl:cpu  .
#   docker build --target cuda -t pactl:cuda .
# Inputs are mounted at /data, outputs at /work (the working directory: runs/, vectors/, index/),
# and every cache (datasets, torch weights) lives under the /cache volume. The default user is
# `pactl` (uid 1000), not root; `docker run --user "$(id -u):$(id -g)"` runs as you instead, so
# that a host folder mounted at /work is written as you.
# Dependencies are installed from pyproject.toml alone, before README.md and the code are
# copied, so a change to pactl/ or to the docs rebuilds only the last layers.
# No C compiler is installed: `pactl train --compile` is not for these images.
# Base images are named with their registry (docker.io/...): podman resolves no short names
# without a registries.conf that lists one. PYTHON_IMAGE and TORCH_INDEX may be replaced with
# --build-arg (tools/docker_check.sh does, for a stand-in base and PyPI's torch).
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim

FROM ${PYTHON_IMAGE} AS cpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PACTL_HOME=/cache/pactl \
    TORCH_HOME=/cache/torch \
    XDG_CACHE_HOME=/cache \
    HF_HOME=/cache/huggingface \
    MPLCONFIGDIR=/cache/matplotlib
WORKDIR /opt/pactl
# CPU wheels of torch/torchvision from PyTorch's CPU index, then pactl's other dependencies,
# installed from pyproject.toml with a placeholder package and README.md, removed again.
COPY pyproject.toml ./
RUN python -m pip install torch torchvision --index-url "$TORCH_INDEX" \
 && mkdir pactl && echo '__version__ = "0"' > pactl/__init__.py && touch README.md \
 && python -m pip install ".[serve]" && python -m pip uninstall -y pactl \
 && rm -rf pactl README.md build ./*.egg-info
COPY README.md ./
COPY pactl ./pactl
# The cache folders that pactl, torch, Hugging Face and matplotlib add entries to are made
# here with mode 1777 (as /tmp): any uid adds its own dataset or weights file, reads the
# others', and cannot delete or replace them. A named volume starts as a copy of them.
RUN python -m pip install --no-deps . \
 && useradd --create-home --uid 1000 pactl \
 && mkdir -p /data /work && chown pactl:pactl /work && chmod 0777 /work \
 && mkdir -p /cache/pactl/datasets/.downloads /cache/torch/hub/checkpoints \
             /cache/huggingface/hub /cache/matplotlib \
 && chmod -R 1777 /cache
VOLUME ["/cache"]
WORKDIR /work
USER 1000:1000
# pactl serve (the serve extra is installed) on the published port:
#   docker run -p 8000:8000 --user "$(id -u):$(id -g)" -v "$PWD:/work" -e PACTL_TOKEN pactl:cpu \
#     serve --host 0.0.0.0
# No BUNDLE: the one `pactl index` wrote last under /work (runs/<run>/index or index/).
EXPOSE 8000
ENTRYPOINT ["pactl"]
CMD ["--help"]

# PyTorch's own CUDA 12 runtime image (torch, torchvision, CUDA 12.6, cuDNN 9).
FROM docker.io/pytorch/pytorch:2.14.0-cuda12.6-cudnn9-runtime AS cuda
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PACTL_HOME=/cache/pactl \
    TORCH_HOME=/cache/torch \
    XDG_CACHE_HOME=/cache \
    HF_HOME=/cache/huggingface \
    MPLCONFIGDIR=/cache/matplotlib
WORKDIR /opt/pactl
# torch comes with the base image; the install keeps it (the range torch>=2.3 is satisfied).
# FAISS with GPU support (the `gpu` extra, faiss-gpu-cu12) replaces faiss-cpu: both install
# the same `faiss` module, so faiss-cpu is removed and the GPU build written again over it.
COPY pyproject.toml ./
RUN mkdir pactl && echo '__version__ = "0"' > pactl/__init__.py && touch README.md \
 && python -m pip install ".[gpu,serve]" && python -m pip uninstall -y faiss-cpu \
 && python -m pip install --no-deps --force-reinstall "faiss-gpu-cu12>=1.11" \
 && python -m pip uninstall -y pactl && rm -rf pactl README.md build ./*.egg-info
COPY README.md ./
COPY pactl ./pactl
# Ubuntu 24.04 images hold a user `ubuntu` with uid 1000, which would make useradd fail.
RUN python -m pip install --no-deps . \
 && if id -u 1000 >/dev/null 2>&1; then userdel --remove "$(id -nu 1000)"; fi \
 && useradd --create-home --uid 1000 pactl \
 && mkdir -p /data /work && chown pactl:pactl /work && chmod 0777 /work \
 && mkdir -p /cache/pactl/datasets/.downloads /cache/torch/hub/checkpoints \
             /cache/huggingface/hub /cache/matplotlib \
 && chmod -R 1777 /cache
VOLUME ["/cache"]
WORKDIR /work
USER 1000:1000
# pactl serve (the serve extra is installed) on the published port:
#   docker run -p 8000:8000 --user "$(id -u):$(id -g)" -v "$PWD:/work" -e PACTL_TOKEN --gpus all \
#     pactl:cuda serve --host 0.0.0.0
EXPOSE 8000
ENTRYPOINT ["pactl"]
CMD ["--help"]
