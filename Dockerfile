# Two targets:
#   docker build --target cpu  -t pactl:cpu  .
#   docker build --target cuda -t pactl:cuda .
# Inputs are mounted at /data, outputs at /work (the working directory: runs/, vectors/, index/),
# and every cache (datasets, torch weights, pip) lives under the /cache volume.

FROM python:3.11-slim AS cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PACTL_HOME=/cache/pactl \
    TORCH_HOME=/cache/torch \
    XDG_CACHE_HOME=/cache \
    MPLCONFIGDIR=/cache/matplotlib
WORKDIR /opt/pactl
COPY pyproject.toml README.md ./
COPY pactl ./pactl
# CPU wheels of torch/torchvision from PyTorch's CPU index, then the package as the Makefile installs it.
RUN python -m pip install --upgrade pip \
 && python -m pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu \
 && python -m pip install .
RUN mkdir -p /data /work /cache && chmod 0777 /work /cache
VOLUME ["/cache"]
WORKDIR /work
ENTRYPOINT ["pactl"]
CMD ["--help"]

FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime AS cuda
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PACTL_HOME=/cache/pactl \
    TORCH_HOME=/cache/torch \
    XDG_CACHE_HOME=/cache \
    MPLCONFIGDIR=/cache/matplotlib
WORKDIR /opt/pactl
COPY pyproject.toml README.md ./
COPY pactl ./pactl
# torch comes with the base image; the install keeps it (the range torch>=2.3 is satisfied).
RUN python -m pip install --upgrade pip && python -m pip install .
RUN mkdir -p /data /work /cache && chmod 0777 /work /cache
VOLUME ["/cache"]
WORKDIR /work
ENTRYPOINT ["pactl"]
CMD ["--help"]
