"""The GPU paths, checked on the CPU.

FAISS: which device `--faiss-device` picks, and that the GPU steps (k-means assignment, list
assignment while adding, exact search) produce the CPU path's index exactly. A fake cloner
stands in for faiss-gpu: it records what it was asked to move and returns the CPU index
itself, so every step runs the same arithmetic on either path.

JPEG decoding (`--gpu-decode`): which files go to the decoder, that failures and their reasons
are the PIL path's, and that the decoder's batch runs on torchvision's CPU decode_jpeg give the
PIL path's vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
import torch
import torchvision
from conftest import make_class_folder, run_cli
from PIL import Image

import pactl.loaders
from pactl.config import IndexConfig, ModelConfig, problems
from pactl.console import QUIET
from pactl.embed import embed_files
from pactl.errors import PactlError
from pactl.index import bundle as bundle_module
from pactl.index import delete_items, load_bundle, save_bundle
from pactl.index.build import build_index
from pactl.index.gpus import faiss_gpus, gpu_searcher
from pactl.index.search import search
from pactl.loaders import GpuJpegDecoder, gpu_decoding, loader_for
from pactl.model import build_model

CPU = torch.device("cpu")


def unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class FakeGpus:
    """faiss-gpu's entry points, on the CPU: clones are the index itself, recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
        self.cloned: list[Any] = []
        self.knn_calls = 0
        monkeypatch.setattr(faiss, "get_num_gpus", lambda: count)
        monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", self.clone, raising=False)
        monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
        monkeypatch.setattr(faiss, "knn_gpu", self.knn_gpu, raising=False)

    def clone(self, index: Any) -> Any:
        self.cloned.append(index)
        return index

    def knn_gpu(self, resources: Any, xq: np.ndarray, xb: np.ndarray, k: int, metric: int) -> Any:
        assert isinstance(xb, np.ndarray) and xb.flags.c_contiguous  # what faiss-gpu takes
        self.knn_calls += 1
        return faiss.knn(xq, xb, k, metric=metric)

    def kinds(self) -> list[str]:
        return [type(faiss.downcast_index(i)).__name__ for i in self.cloned]


def make(x: np.ndarray, factory: str, device: str) -> tuple[Any, dict[str, Any]]:
    return build_index(x, IndexConfig(factory=factory, faiss_device=device), QUIET, seed=3)


def same_index(a: Any, b: Any, queries: np.ndarray) -> None:
    assert np.array_equal(faiss.serialize_index(a), faiss.serialize_index(b))
    sa, ia = a.search(queries, 10)
    sb, ib = b.search(queries, 10)
    assert np.array_equal(ia, ib) and np.array_equal(sa, sb)


def without_device(record: dict[str, Any]) -> dict[str, Any]:
    """The record less what the device and the clock change: GPUs, seconds, ms a query."""
    kept = {k: v for k, v in record.items() if k != "faiss_gpus" and not k.endswith("seconds")}
    points = [
        {k: v for k, v in p.items() if k != "ms_per_query"} for p in record["operating_points"]
    ]
    return {**kept, "operating_points": points}


@pytest.mark.parametrize(
    ("count", "device", "expected"),
    [(0, "auto", 0), (0, "cpu", 0), (2, "auto", 2), (2, "cpu", 0), (1, "gpu", 1)],
)
def test_faiss_device_picks_the_gpus_only_when_faiss_has_them(
    monkeypatch: pytest.MonkeyPatch, count: int, device: str, expected: int
) -> None:
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: count)
    assert faiss_gpus(device) == expected


def test_asking_for_a_gpu_without_one_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0)
    with pytest.raises(PactlError, match=r"sees no GPU.*pactl\[gpu\]"):
        faiss_gpus("gpu")
    with pytest.raises(PactlError, match="choose one of auto, cpu, gpu"):
        faiss_gpus("tpu")
    assert problems(IndexConfig(faiss_device="tpu"))[0][0] == "faiss_device"


def test_this_faiss_has_no_gpu_and_auto_never_touches_the_gpu_entry_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a GPU entry point was called on the CPU path")

    assert faiss.get_num_gpus() == 0  # the test extra installs faiss-cpu
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", refuse, raising=False)
    monkeypatch.setattr(faiss, "knn_gpu", refuse, raising=False)
    x = unit_rows(1500, 16, 0)
    index, record = make(x, "IVF16,Flat", "auto")
    assert record["faiss_gpus"] == 0 and index.ntotal == 1500


def test_ivf_on_gpus_trains_and_adds_there_and_equals_the_cpu_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = unit_rows(2000, 16, 1)
    on_cpu, cpu_record = make(x, "IVF16,Flat", "cpu")
    gpus = FakeGpus(monkeypatch, 1)
    on_gpu, gpu_record = make(x, "IVF16,Flat", "auto")
    # k-means on a brute-force index in the quantiser's metric, then the quantiser for adding
    assert gpus.kinds() == ["IndexFlat", "IndexFlat"]
    assert gpus.cloned[0].metric_type == faiss.METRIC_INNER_PRODUCT
    assert gpus.knn_calls == 1  # the tuning's exact neighbours
    assert gpu_record["faiss_gpus"] == 1 and cpu_record["faiss_gpus"] == 0
    assert without_device(gpu_record) == without_device(cpu_record)
    ivf = faiss.extract_index_ivf(on_gpu)
    assert ivf.clustering_index is None  # nothing of the GPU copies stays in the saved index
    same_index(on_gpu, on_cpu, x[:50])


def test_graph_quantiser_trains_on_gpus_in_l2_and_adds_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = unit_rows(2000, 16, 2)
    on_cpu, cpu_record = make(x, "IVF16_HNSW8,Flat", "cpu")
    gpus = FakeGpus(monkeypatch, 2)
    on_gpu, gpu_record = make(x, "IVF16_HNSW8,Flat", "gpu")
    assert gpus.kinds() == ["IndexFlat"]  # k-means only: an HNSW quantiser assigns on the CPU
    assert gpus.cloned[0].metric_type == faiss.METRIC_L2  # as the CPU training's assigner
    assert without_device(gpu_record) == without_device(cpu_record)
    same_index(on_gpu, on_cpu, x[:50])


def test_flat_searches_exactly_on_gpus_with_the_cpu_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = unit_rows(800, 8, 3)
    on_cpu, cpu_record = make(x, "Flat", "cpu")
    gpus = FakeGpus(monkeypatch, 1)
    on_gpu, gpu_record = make(x, "Flat", "auto")
    assert gpus.kinds() == ["IndexIDMap2"] and gpus.knn_calls == 1
    assert without_device(gpu_record) == without_device(cpu_record)
    assert gpu_record["recall_at_10"] == 1.0
    same_index(on_gpu, on_cpu, x[:50])
    # and the exact search itself against a float64 brute force
    scores = x[:20].astype(np.float64) @ x.astype(np.float64).T
    truth = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    assert np.array_equal(gpu_searcher(on_gpu, 1).search(x[:20], 5)[1], truth)


# ------------------------------------------------------------------------ searching at queries


class CountingCopy:
    """A "GPU copy" of an index that answers with the index and counts what it was asked."""

    def __init__(self, index: Any) -> None:
        self.index, self.depths = index, []

    def search(self, x: np.ndarray, k: int) -> Any:
        self.depths.append(k)
        return self.index.search(x, k)


def flat_bundle(tmp_path: Path, x: np.ndarray, factory: str = "Flat") -> Path:
    index, record = make(x, factory, "cpu")
    rows = [(i, f"/photos/{i}.png", f"c{i % 3}") for i in range(len(x))]
    save_bundle(tmp_path / "b", index, rows, {"fingerprint": "f" * 64, **record})
    return tmp_path / "b"


def test_a_flat_bundle_searches_on_the_gpus_and_deep_searches_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = unit_rows(300, 8, 5)
    bundle_dir = flat_bundle(tmp_path, x)
    dead = np.arange(0, 300, 2)  # every other item deleted: rows need deeper searches
    delete_items(bundle_dir, ids=dead.tolist())
    on_cpu = load_bundle(bundle_dir)
    want = {k: search(on_cpu, x[:30], k) for k in (10, 20)}  # the CPU's answers

    copies: list[CountingCopy] = []
    gpus = FakeGpus(monkeypatch, 1)
    monkeypatch.setattr(
        faiss, "index_cpu_to_all_gpus", lambda i: copies.append(CountingCopy(i)) or copies[-1]
    )
    monkeypatch.setattr(bundle_module, "GPU_MAX_K", 24)  # what the GPU selects, scaled down
    bundle = load_bundle(bundle_dir, faiss_device="auto")
    assert len(copies) == 1 and bundle.gpu_index is copies[0]
    for k in (10, 20):
        scores, ids = search(bundle, x[:30], k)
        np.testing.assert_array_equal(ids, want[k][1])
        np.testing.assert_array_equal(scores, want[k][0])
        assert not np.isin(ids, dead).any() and (ids >= 0).all()
    # k=10 asks for 20 (10 more for tombstones) on the copy; rows left short go 40 deep,
    # past what the GPU selects, on the CPU; so does all of k=20 (40 from the start)
    assert copies[0].depths == [20] and gpus.knn_calls == 0
    truth = np.argsort(-(x[:5].astype(np.float64) @ x.T.astype(np.float64)), axis=1)
    live_truth = [[int(i) for i in row if i % 2][:4] for row in truth]
    assert search(bundle, x[:5], 4)[1].tolist() == live_truth


@pytest.mark.parametrize(
    ("factory", "device", "count"),
    [("IVF8,Flat", "auto", 1), ("Flat", "cpu", 1), ("Flat", "auto", 0)],
)
def test_only_a_flat_index_on_a_machine_with_gpus_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory: str, device: str, count: int
) -> None:
    bundle_dir = flat_bundle(tmp_path, unit_rows(400, 8, 6), factory)
    gpus = FakeGpus(monkeypatch, count)
    bundle = load_bundle(bundle_dir, faiss_device=device)
    assert bundle.gpu_index is None and gpus.cloned == []
    assert bundle.searcher(10) is bundle.index


def test_a_flat_index_the_gpu_cloner_refuses_searches_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle_dir = flat_bundle(tmp_path, unit_rows(100, 8, 7))
    FakeGpus(monkeypatch, 2)

    def refuse(index: Any) -> Any:
        raise RuntimeError("Error in virtual Index *faiss::Cloner::clone_Index: unsupported")

    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", refuse)
    bundle = load_bundle(bundle_dir, faiss_device="gpu")
    assert bundle.gpu_index is None and bundle.searcher(1) is bundle.index


def test_cli_query_faiss_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = make_class_folder(tmp_path / "imgs", classes=2, per_class=3)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["index", str(folder), *SMALL, "--out", "b", "-q"], monkeypatch, capsys)
    assert code == 0, err
    query = str(next(folder.rglob("*.png")))
    on_cpu = ["query", query, "--index", "b", "--format", "csv", "--faiss-device", "cpu"]
    code, cpu_out, err = run_cli(on_cpu, monkeypatch, capsys)
    assert code == 0 and cpu_out.count("\n") == 5, err
    code, out, err = run_cli(on_cpu[:-1] + ["gpu"], monkeypatch, capsys)
    assert (code, out) == (1, "") and "sees no GPU" in err and "pactl[gpu]" in err
    assert len(err.strip().splitlines()) == 1
    gpus = FakeGpus(monkeypatch, 1)  # a machine with a GPU: the same rows, searched on the copy
    code, out, err = run_cli(on_cpu[:-1] + ["auto"], monkeypatch, capsys)
    assert (code, out) == (0, cpu_out) and gpus.kinds() == ["IndexIDMap2"], err
    remote = ["query", query, "--server", "http://127.0.0.1:9", "--faiss-device", "cpu"]
    code, _, err = run_cli(remote, monkeypatch, capsys)
    assert code == 2 and "drop --faiss-device" in err


# ---------------------------------------------------------------------------- JPEG decoding


def save_jpeg(path: Path, pixels: np.ndarray, **params: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "L" if pixels.ndim == 2 else "RGB"
    Image.fromarray(pixels, mode=mode).save(path, "JPEG", quality=95, **params)
    return path


def bomb(path: Path) -> Path:
    """A small JPEG whose header claims 20000 x 20000 pixels (over the 178.9M limit)."""
    data = bytearray((save_jpeg(path, np.zeros((8, 8, 3), np.uint8))).read_bytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (20000).to_bytes(2, "big") * 2  # height, width
    path.write_bytes(bytes(data))
    return path


def mixed_files(root: Path) -> list[Path]:
    """JPEGs for the GPU (RGB and grey, at the network size), and files that must take PIL:
    a PNG, a rotated JPEG, a CMYK JPEG; and three that fail: a decompression bomb, a broken
    file, a truncated JPEG."""
    rng = np.random.default_rng(7)
    files = [
        save_jpeg(root / f"{i}.jpg", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        for i in range(5)
    ]
    files.append(save_jpeg(root / "grey.jpg", rng.integers(0, 256, (32, 32), dtype=np.uint8)))
    png = root / "p.png"
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(png)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: PIL turns it upright, nvJPEG would not
    rotated = root / "rotated.jpg"
    save_jpeg(rotated, rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), exif=exif.tobytes())
    cmyk = root / "cmyk.jpg"
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).convert("CMYK").save(cmyk)
    broken = root / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not a JPEG after all")
    cut = root / "cut.jpg"  # truncated: the GPU might decode it half grey; PIL refuses it
    cut.write_bytes(files[0].read_bytes()[:-300])
    return [*files, png, rotated, cmyk, bomb(root / "bomb.jpg"), broken, cut]


def tiny() -> tuple[Any, ModelConfig]:
    config = ModelConfig(backbone="small", weights="none", image_size=32, resize_size=32)
    return build_model(config, seed=4)


def test_gpu_decoding_is_asked_for_and_on_cuda_only() -> None:
    assert not gpu_decoding(torch.device("cpu"), True)
    assert not gpu_decoding(torch.device("cuda", 0), False)
    assert gpu_decoding(torch.device("cuda", 0), True)


def test_gpu_decode_on_the_cpu_is_the_pil_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decode_jpeg called on the CPU path")

    monkeypatch.setattr(torchvision.io, "decode_jpeg", refuse)
    files = mixed_files(tmp_path)
    net, config = tiny()
    asked = embed_files(net, files, config, CPU, QUIET, batch_size=4, gpu_decode=True)
    plain = embed_files(net, files, config, CPU, QUIET, batch_size=4)
    np.testing.assert_array_equal(asked.vectors, plain.vectors)
    assert asked.failed == plain.failed and len(plain.failed) == 3


class Decodes:
    """torchvision.io.decode_jpeg on the CPU, recording calls; `refuse` bytes raise."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refuse: bytes = b"") -> None:
        self.real = torchvision.io.decode_jpeg
        self.refuse = refuse
        self.batches: list[int] = []
        monkeypatch.setattr(torchvision.io, "decode_jpeg", self)
        # The decoder runs where a CUDA device would be: here, on the CPU.
        monkeypatch.setattr(pactl.loaders, "gpu_decoding", lambda device, asked: asked)

    def __call__(self, data: Any, mode: Any, device: Any) -> Any:
        assert torch.device(device) == CPU  # the embed device is passed through
        datas = data if isinstance(data, list) else [data]
        if self.refuse and any(bytes(d.numpy()) == self.refuse for d in datas):
            raise RuntimeError("nvjpeg: unsupported")
        self.batches.append(len(datas))
        return self.real(data, mode=mode, device=device)


def test_the_gpu_decoder_gives_the_pil_vectors_and_the_same_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = mixed_files(tmp_path)
    net, config = tiny()
    plain = embed_files(net, files, config, CPU, QUIET, batch_size=4)
    decodes = Decodes(monkeypatch)
    on_gpu = embed_files(net, files, config, CPU, QUIET, batch_size=4, gpu_decode=True)
    # 6 plain JPEGs go to the decoder in batch order (4 files per batch); the rest take PIL
    assert decodes.batches == [4, 2]
    np.testing.assert_array_equal(on_gpu.rows, plain.rows)
    np.testing.assert_allclose(on_gpu.vectors, plain.vectors, atol=1e-5)  # same pixels
    assert on_gpu.failed == plain.failed
    reasons = dict(on_gpu.failed)
    assert "decompression bomb" in reasons[files.index(tmp_path / "bomb.jpg")]
    assert "truncated" in reasons[files.index(tmp_path / "cut.jpg")]


def test_a_file_the_gpu_cannot_decode_takes_the_pil_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = mixed_files(tmp_path)[:6]
    net, config = tiny()
    plain = embed_files(net, files, config, CPU, QUIET, batch_size=8)
    decodes = Decodes(monkeypatch, refuse=files[2].read_bytes())
    on_gpu = embed_files(net, files, config, CPU, QUIET, batch_size=8, gpu_decode=True)
    assert decodes.batches == [1] * 5  # the batch failed, then each alone: 5 of 6 decoded
    np.testing.assert_array_equal(on_gpu.rows, np.arange(6))
    np.testing.assert_allclose(on_gpu.vectors, plain.vectors, atol=1e-5)
    assert on_gpu.failed == []


def test_the_gpu_transform_resizes_and_crops_as_pil_does(tmp_path: Path) -> None:
    """A 96x72 photo-like JPEG to 32 px (resize 36, centre crop): the decoder's input to the
    network against the PIL transform's, pixel for pixel within JPEG/filter rounding."""
    yy, xx = np.mgrid[0:72, 0:96]
    smooth = np.stack([xx * 2.5, yy * 3.5, (xx + yy) * 1.5], axis=-1).clip(0, 255)
    path = save_jpeg(tmp_path / "wide.jpg", smooth.astype(np.uint8))
    config = ModelConfig(backbone="small", weights="none", image_size=32, resize_size=36)
    _, config = build_model(config)
    loader = loader_for([path], None, config, 1, 0, CPU, draft=False, raw_jpeg=True)
    batch = next(iter(loader))
    assert len(batch.raw) == 1 and len(batch.indices) == 0
    images, indices, failed = GpuJpegDecoder(loader.dataset, config, CPU)(batch.raw)
    want = loader.dataset.decoded(0)[0]
    assert images.shape == (1, 3, 32, 32) and indices.tolist() == [0] and failed == []
    assert float((images[0] - want).abs().mean()) < 0.02  # normalised units (std 0.5)


SMALL = ["--backbone", "small", "--weights", "none"]


def test_cli_index_faiss_device_gpu_on_this_machine_is_one_line_and_cpu_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = make_class_folder(tmp_path / "imgs", classes=2, per_class=3)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(
        ["index", str(folder), *SMALL, "--faiss-device", "gpu", "--out", "b"],
        monkeypatch,
        capsys,
    )
    assert code == 1 and "sees no GPU" in err and "pactl[gpu]" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "b").exists()
    code, out, err = run_cli(
        ["index", str(folder), *SMALL, "--faiss-device", "cpu", "--out", "b", "-q"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "meta.json").read_text())["faiss_gpus"] == 0
