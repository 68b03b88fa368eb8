"""FAISS on GPUs: how many, copies of an index, the clustering of an IVF's training."""

from __future__ import annotations

from typing import Any

import faiss

from pactl.errors import PactlError

FAISS_DEVICES = ("auto", "cpu", "gpu")  # auto: the GPUs when this FAISS has any, else the CPU
GPU_MAX_K = 2048  # the most hits a FAISS GPU search selects per query (GPU_MAX_SELECTION_K)
GPU_INSTALL = "pip install 'pactl[gpu]' (see docs/cli.md, pactl index --faiss-device)"


def faiss_gpus(device: str = "auto") -> int:
    """How many GPUs FAISS uses for `device` (0: the CPU path). faiss-cpu reports none; the
    `gpu` extra's faiss-gpu-cu12 reports the visible CUDA devices."""
    if device not in FAISS_DEVICES:
        raise PactlError(f"FAISS device {device!r}: choose one of {', '.join(FAISS_DEVICES)}")
    count = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    if device == "gpu" and count < 1:
        raise PactlError(f"--faiss-device gpu: this FAISS sees no GPU; install {GPU_INSTALL}")
    return 0 if device == "cpu" else count


def to_gpus(index: Any) -> Any:
    """`index` copied onto every visible GPU (one replica on each)."""
    return faiss.index_cpu_to_all_gpus(index)


def gpu_searcher(index: Any, gpus: int) -> Any:
    """What to search `index` with: a GPU copy of a brute-force (Flat) index when there are
    GPUs, else the index itself. Other kinds search on the CPU, with their tuned parameters."""
    if not gpus or not is_flat(index):
        return index
    try:
        return to_gpus(index)
    except RuntimeError:  # a wrapper the GPU cloner does not know: the same search on the CPU
        return index


def is_flat(index: Any) -> bool:
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    return isinstance(faiss.downcast_index(inner), faiss.IndexFlat)


def clustering_on_gpus(ivf: Any) -> Any:
    """A GPU brute-force index for the k-means of an IVF's training, in the metric the CPU
    training would use (the quantiser's own when it trains alone, else L2), so assignments,
    and hence the lists, match the CPU path's."""
    mode = ivf.quantizer_trains_alone  # a C char: SWIG hands it over as a one-letter str
    trains_alone = ord(mode) if isinstance(mode, str) else int(mode)
    metric = ivf.quantizer.metric_type if trains_alone == 0 else faiss.METRIC_L2
    return to_gpus(faiss.IndexFlat(ivf.d, metric))


def gpu_quantizer(index: Any, gpus: int) -> tuple[Any, Any] | None:
    """(ivf, GPU copy of its brute-force quantiser) while adding on GPUs; None to add on the CPU
    (no GPUs, not IVF, or a graph quantiser, which assigns cheaply on the CPU)."""
    ivf = faiss.try_extract_index_ivf(index) if gpus else None
    if ivf is None or not isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexFlat):
        return None
    return ivf, to_gpus(faiss.downcast_index(ivf.quantizer))
