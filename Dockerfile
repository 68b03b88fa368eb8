# Two targets:
#   docker build --target cpu  -t pactl:cpu  .
#   docker build --target cuda -t pactl:cuda .
# Inputs are mounted at /data, outputs at /work (the working directory: runs/, vectors/, index/),
# and every cache (datasets, torch weights) lives under the /cache volume. The default user is
# `pactl` (uid 1000), not root; `docker run --user "$(id -u):$(id -g)"` runs as you instead.
# Dependencies are installed before the code is copied, so a change to pactl/ rebuilds only the
# last layers. No C compiler is installed: `pactl train --compile` is not for these images.

FROM python:3.11-slim AS cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PACTL_HOME=/cache/pactl \
    TORCH_HOME=/cache/torch \
    XDG_CACHE_HOME=/cache \
    MPLCONFIGDIR=/cache/matplotlib
WORKDIR /opt/pactl
# CPU wheels of torch/torchvision from PyTorch's CPU index, then pactl's other dependencies
# (installed from pyproject.toml with a placeholder package, which is removed again).
COPY pyproject.toml README.md ./
RUN python -m pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu \
 && mkdir pactl && echo '__version__ = "0"' > pactl/__init__.py \
 && python -m pip install ".[serve]" && python -m pip uninstall -y pactl && rm -r pactl
COPY pactl ./pactl
RUN python -m pip install --no-deps . \
 && useradd --create-home --uid 1000 pactl \
 && mkdir -p /data /work /cache && chown pactl:pactl /work /cache && chmod 0777 /work /cache
VOLUME ["/cache"]
WORKDIR /work
USER 1000:1000
# pactl serve (the serve extra is installed) on the published port:
#   docker run -p 8000:8000 -v "$PWD:/work" pactl:cpu serve /work/index --host 0.0.0.0 --token "$PACTL_TOKEN"
EXPOSE 8000
ENTRYPOINT ["pactl"]
CMD ["--help"]

# PyTorch's own CUDA 12 runtime image (torch, torchvision, CUDA 12.6, cuDNN 9).
FROM pytorch/pytorch:2.14.0-cuda12.6-cudnn9-runtime AS cuda
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PACTL_HOME=/cache/pactl \
    TORCH_HOME=/cache/torch \
    XDG_CACHE_HOME=/cache \
    MPLCONFIGDIR=/cache/matplotlib
WORKDIR /opt/pactl
# torch comes with the base image; the install keeps it (the range torch>=2.3 is satisfied).
# FAISS with GPU support (the `gpu` extra, faiss-gpu-cu12) replaces faiss-cpu: both install
# the same `faiss` module, so faiss-cpu is removed and the GPU build written again over it.
COPY pyproject.toml README.md ./
RUN mkdir pactl && echo '__version__ = "0"' > pactl/__init__.py \
 && python -m pip install ".[gpu,serve]" && python -m pip uninstall -y faiss-cpu \
 && python -m pip install --no-deps --force-reinstall "faiss-gpu-cu12>=1.11" \
 && python -m pip uninstall -y pactl && rm -r pactl
COPY pactl ./pactl
# Ubuntu 24.04 images hold a user `ubuntu` with uid 1000, which would make useradd fail.
RUN python -m pip install --no-deps . \
 && if id -u 1000 >/dev/null 2>&1; then userdel --remove "$(id -nu 1000)"; fi \
 && useradd --create-home --uid 1000 pactl \
 && mkdir -p /data /work /cache && chown pactl:pactl /work /cache && chmod 0777 /work /cache
VOLUME ["/cache"]
WORKDIR /work
USER 1000:1000
# pactl serve (the serve extra is installed) on the published port:
#   docker run -p 8000:8000 -v "$PWD:/work" --gpus all pactl:cuda serve /work/index --host 0.0.0.0 --token "$PACTL_TOKEN"
EXPOSE 8000
ENTRYPOINT ["pactl"]
CMD ["--help"]
