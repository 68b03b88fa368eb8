"""The fast inference path: a network prepared once for many images (TorchScript freezing,
BatchNorm folded into convolutions, torch.compile for large collections), checked against the
eager network before it is used."""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from typing import Any

import torch
from torch import nn

from pactl.config import ModelConfig

# Preparing a frozen CPU network costs a few seconds (resnet50: trace, freeze, first calls) and
# saves about 15 ms per image: worth it from a few hundred images on.
PREPARE_MIN_IMAGES = 256


PREPARED = "_pactl_prepared"  # set on a network inference_model() made: prepared once


def torchscript_available() -> bool:
    """TorchScript's trace, freeze and optimize_for_inference are all there: deprecated since
    torch 2.10 and due to go, so their absence is a case, not an error."""
    jit = getattr(torch, "jit", None)
    names = ("trace", "freeze", "optimize_for_inference")
    return all(callable(getattr(jit, name, None)) for name in names)


def is_prepared(model: nn.Module) -> bool:
    script = getattr(getattr(torch, "jit", None), "ScriptModule", None)
    return bool(getattr(model, PREPARED, False)) or (
        isinstance(script, type) and isinstance(model, script)
    )


def freeze_torchscript(model: nn.Module, example: torch.Tensor) -> nn.Module:
    """A traced, frozen copy: BatchNorm folded into the convolutions, weights pre-packed for
    oneDNN, the graph fused. Raises where TorchScript is gone or cannot follow the network."""
    if not torchscript_available():
        raise RuntimeError("this torch has no TorchScript freezing")
    traced = torch.jit.trace(model, example, check_trace=False)
    return torch.jit.optimize_for_inference(torch.jit.freeze(traced))


def fuse_batchnorm(model: nn.Module, example: torch.Tensor | None = None) -> nn.Module:
    """A copy of an eval-mode network whose Conv -> BatchNorm pairs are one convolution each,
    found in a torch.fx trace; everything else runs eagerly. Raises when fx cannot trace it."""
    from torch.fx.experimental.optimization import fuse

    return fuse(model, inplace=False)


COMPILE_MIN_IMAGES = 5_000  # torch.compile's one-off cost (tens of seconds) pays from here on


COMPILE_CHUNK = 32  # images per compiled call: one shape, so one compilation


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would call ($CXX, g++, c++ or clang++), or None: the Docker
    images and many laptops have none, and compiling without one fails after minutes."""
    names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    return next((found for found in map(shutil.which, filter(None, names)) if found), None)


class Compiled(nn.Module):
    """torch.compile (inductor, with freezing: BatchNorm folded, weights pre-packed, constants
    folded) run on chunks of exactly COMPILE_CHUNK images, the last one padded, so it compiles
    once: a new batch size would cost a second compilation. Eval mode makes every image's
    output its own, so the padding changes nothing."""

    def __init__(self, model: nn.Module, chunk: int = COMPILE_CHUNK) -> None:
        super().__init__()
        self.net = model
        self.compiled = torch.compile(model, dynamic=False)
        self.chunk = chunk

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        from torch._inductor import config as inductor

        outputs = []
        # One mode, layout and kind of input tensor for every call (a loader's batch may be an
        # inference tensor), so the compiled graph's guards always hold: nothing recompiles.
        with torch.inference_mode(False), torch.no_grad(), inductor.patch(freezing=True):
            for start in range(0, len(images), self.chunk):
                part = images[start : start + self.chunk]
                short = self.chunk - len(part)
                padding = [part[:1].expand(short, *part.shape[1:])] if short else []
                part = torch.cat([part, *padding]).contiguous(memory_format=torch.channels_last)
                outputs.append(self.compiled(part)[: self.chunk - short])
        return torch.cat(outputs)


def compile_frozen(model: nn.Module, example: torch.Tensor) -> nn.Module:
    """A Compiled copy, compiled here on `example`. Raises without a C++ compiler or
    torch.compile, or when inductor fails."""
    if cpp_compiler() is None or not callable(getattr(torch, "compile", None)):
        raise RuntimeError("torch.compile needs a C++ compiler on the CPU")
    # Inductor looks for CUDA and says so in a raw log line even on the CPU path: not for users.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    compiled = Compiled(model)
    compiled(example)
    return compiled


# The CPU fast paths, fastest first (bench/bench_embed.py --fastpath; docs/benchmarks.md):
# torch.compile with freezing for large embeds (its compilation costs tens of seconds), then
# TorchScript freezing while torch has it, else BatchNorm folding through torch.fx.
FAST_PATHS = (freeze_torchscript, fuse_batchnorm)


def inference_model(
    model: nn.Module,
    model_config: ModelConfig,
    device: torch.device,
    amp: str = "none",
    channels_last: bool = True,
    freeze: bool = True,
    compile: bool = False,
) -> nn.Module:
    """The network as embedding runs it: eval mode, NHWC convolutions, and (with `freeze`) on
    the CPU in float32 the first of the fast paths that prepares a copy whose outputs agree
    with the network's. With `compile` (an embed of COMPILE_MIN_IMAGES images or more) and a
    C++ compiler, torch.compile with freezing (resnet50 at 224 on 2 x86 cores: 0.6x the CPU
    time per image of TorchScript; see docs/benchmarks.md); then FAST_PATHS: a TorchScript-frozen
    copy (BatchNorm folded, weights pre-packed for oneDNN), or, where TorchScript is gone, a
    copy with BatchNorm folded by torch.fx. A network none can follow runs as it is; so does an
    already prepared one, so callers that embed in chunks prepare once."""
    if is_prepared(model):
        return model
    model.eval()
    if channels_last:  # NHWC convolutions: several times faster, on CPUs as on GPUs
        model.to(memory_format=torch.channels_last)
    if not freeze or device.type != "cpu" or amp != "none":
        return model
    size = model_config.image_size
    generator = torch.Generator().manual_seed(0)
    # Prepared at one batch size, checked at another: a network whose forward depends on the
    # batch (or on the values) in ways a trace cannot record runs eagerly instead.
    example, check = (torch.randn(n, 3, size, size, generator=generator) for n in (2, 3))
    if channels_last:
        example, check = (t.contiguous(memory_format=torch.channels_last) for t in (example, check))
    paths = (compile_frozen, *FAST_PATHS) if compile else FAST_PATHS
    for prepare in paths:
        fast = _checked(prepare, model, example, check)
        if fast is not None:
            setattr(fast, PREPARED, True)
            return fast
    return model


def _checked(
    prepare: Any, model: nn.Module, example: torch.Tensor, check: torch.Tensor
) -> nn.Module | None:
    """prepare(model, example) if it works and agrees with `model` on `check`, else None."""
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's deprecation and trace-shape notes
            fast = prepare(model, example)
            agrees = torch.allclose(fast(check), model(check), atol=1e-4, rtol=1e-3)
    except Exception:  # any failure to prepare: the next path, or the eager network
        return None
    return fast if agrees else None
