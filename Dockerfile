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
 && python -m pip install . && python -m pip uninstall -y pactl && rm -r pactl
COPY pactl ./pactl
RUN python -m pip install --no-deps . \
 && useradd --create-home --uid 1000 pactl \
 && mkdir -p /data /work /cache && chown pactl:pactl /work /cache && chmod 0777 /work /cache
VOLUME ["/cache"]
WORKDIR /work
USER 1000:1000
ENTRYPOINT ["pactl"]
CMD ["--help"]

FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime AS cuda
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PACTL_HOME=/cache/pactl \
    TORCH_HOME=/cache/torch \
    XDG_CACHE_HOME=/cache \
    MPLCONFIGDIR=/cache/matplotlib
WORKDIR /opt/pactl
# torch comes with the base image; the install keeps it (the range torch>=2.3 is satisfied).
COPY pyproject.toml README.md ./
RUN mkdir pactl && echo '__version__ = "0"' > pactl/__init__.py \
 && python -m pip install . && python -m pip uninstall -y pactl && rm -r pactl
COPY pactl ./pactl
RUN python -m pip install --no-deps . \
 && useradd --create-home --uid 1000 pactl \
 && mkdir -p /data /work /cache && chown pactl:pactl /work /cache && chmod 0777 /work /cache
VOLUME ["/cache"]
WORKDIR /work
USER 1000:1000
ENTRYPOINT ["pactl"]
CMD ["--help"]
