"""The four benchmarks end to end: tiny archives in each dataset's real layout, served over HTTP
on 127.0.0.1 or handed over with --from, turned into manifests with the standard splits."""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import io
import re
import shutil
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from pactl.console import QUIET
from pactl.datasets import catalog
from pactl.datasets.archives import UnsafeArchive
from pactl.datasets.catalog import CATALOG, DatasetSpec, prepare_dataset
from pactl.datasets.download import Archive, ChecksumError, FetchOptions
from pactl.datasets.manifest import read_manifest
from pactl.errors import PactlError

FAST = FetchOptions(attempts=2, retry_wait=0.0, timeout=5.0)
Row = tuple[str, int, str, str]


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def _tgz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _lines(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


# ---- tiny datasets in their published layouts ---------------------------------------------------

CUB_CLASSES = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross",
               "004.Groove_billed_Ani"]  # fmt: skip


def build_cub(folder: Path) -> tuple[dict[str, Path], list[Row]]:
    """CUB_200_2011.tgz: 4 classes x 2 images; classes 1-2 train, 3-4 test."""
    files, images, labels, expected = {}, [], [], []
    image_id = 0
    for class_id, name in enumerate(CUB_CLASSES, start=1):
        for k in range(2):
            image_id += 1
            rel = f"{name}/{name.split('.')[1]}_{k:04d}_{image_id}.jpg"
            files[f"CUB_200_2011/images/{rel}"] = _jpeg(image_id)
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {class_id}")
            split = "train" if class_id <= 2 else "test"
            expected.append((f"CUB_200_2011/images/{rel}", class_id, split, name))
    files["CUB_200_2011/images.txt"] = _lines(*images)
    files["CUB_200_2011/image_class_labels.txt"] = _lines(*labels)
    files["CUB_200_2011/classes.txt"] = _lines(*(f"{i} {n}" for i, n in enumerate(CUB_CLASSES, 1)))
    files["CUB_200_2011/train_test_split.txt"] = _lines(*(f"{i} {i % 2}" for i in range(1, 9)))
    files["attributes.txt"] = _lines("1 has_bill_shape::curved_(up_or_down)")
    return {"CUB_200_2011.tgz": _tgz(folder / "CUB_200_2011.tgz", files)}, expected


CARS_NAMES = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012",
              "Acura TL Type-S 2008"]  # fmt: skip
# (class, test flag) per image, in no particular order; the test flag must not decide the split.
CARS_IMAGES = [(3, 0), (1, 1), (4, 0), (2, 0), (1, 0), (3, 1), (2, 1), (4, 1)]


def _cars_mat(path: Path) -> Path:
    """cars_annos.mat as MATLAB writes it: a 1xN struct array and a 1xC cell of names."""
    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    annotations = np.zeros((1, len(CARS_IMAGES)), dtype=[(f, "O") for f in fields])
    for i, (class_id, test) in enumerate(CARS_IMAGES):
        box = [np.array([[v]], dtype=np.uint16) for v in (1, 2, 7, 8)]
        annotations[0, i] = (
            np.array([f"car_ims/{i + 1:06d}.jpg"]),
            *box,
            np.array([[class_id]], dtype=np.uint8),
            np.array([[test]], dtype=np.uint8),
        )
    names = np.empty((1, len(CARS_NAMES)), dtype=object)
    for j, name in enumerate(CARS_NAMES):
        names[0, j] = np.array([name])
    scipy.io.savemat(path, {"annotations": annotations, "class_names": names})
    return path


def _cars_expected(prefix: str = "") -> list[Row]:
    return [
        (f"{prefix}car_ims/{i + 1:06d}.jpg", c, "train" if c <= 2 else "test", CARS_NAMES[c - 1])
        for i, (c, _) in enumerate(CARS_IMAGES)
    ]


def build_cars(folder: Path) -> tuple[dict[str, Path], list[Row]]:
    """car_ims.tgz + cars_annos.mat: 4 classes x 2 images; classes 1-2 train, 3-4 test."""
    images = {f"car_ims/{i + 1:06d}.jpg": _jpeg(100 + i) for i in range(len(CARS_IMAGES))}
    archives = {
        "car_ims.tgz": _tgz(folder / "car_ims.tgz", images),
        "cars_annos.mat": _cars_mat(folder / "cars_annos.mat"),
    }
    return archives, _cars_expected()


SOP_TRAIN = [(1, 1, "bicycle_final"), (2, 1, "bicycle_final"), (3, 2, "chair_final")]
SOP_TEST = [(4, 2, "chair_final"), (5, 1, "bicycle_final"), (6, 2, "chair_final")]


def build_sop(folder: Path) -> tuple[dict[str, Path], list[Row]]:
    """Stanford_Online_Products.zip: 3 training products, 3 test products, 2 images each."""
    files: dict[str, bytes] = {}
    expected = []
    image_id = 0
    for listing, split, products in (("Ebay_train", "train", SOP_TRAIN),
                                     ("Ebay_test", "test", SOP_TEST)):  # fmt: skip
        lines = ["image_id class_id super_class_id path"]
        for class_id, super_id, category in products:
            for k in range(2):
                image_id += 1
                rel = f"{category}/{111085122870 + class_id}_{k}.JPG"
                files[f"Stanford_Online_Products/{rel}"] = _jpeg(200 + image_id)
                lines.append(f"{image_id} {class_id} {super_id} {rel}")
                expected.append((f"Stanford_Online_Products/{rel}", class_id, split, ""))
        files[f"Stanford_Online_Products/{listing}.txt"] = _lines(*lines)
    files["Stanford_Online_Products/Ebay_info.txt"] = _lines(
        "image_id class_id super_class_id path"
    )
    zip_path = _zip(folder / "Stanford_Online_Products.zip", files)
    return {"Stanford_Online_Products.zip": zip_path}, expected


INSHOP_ITEMS = [(2, "train", "WOMEN/Dresses"), (5, "train", "MEN/Denim"),
                (7, "query", "WOMEN/Skirts"), (7, "gallery", "WOMEN/Skirts"),
                (10, "query", "MEN/Shirts_Polos"), (10, "gallery", "MEN/Shirts_Polos")]  # fmt: skip


def _inshop_listing() -> tuple[list[str], dict[str, bytes]]:
    lines, images = [], {}
    for n, (item, split, category) in enumerate(INSHOP_ITEMS):
        rel = f"img/{category}/id_{item:08d}/{n:02d}_1_front.jpg"
        images[rel] = _jpeg(300 + n)
        lines.append(f"{rel} id_{item:08d} {split}")
    return [str(len(lines)), "image_name item_id evaluation_status", *lines], images


def build_inshop(folder: Path) -> tuple[dict[str, Path], list[Row]]:
    """img.zip + list_eval_partition.txt: 2 training items, 2 items in query and gallery."""
    lines, images = _inshop_listing()
    listing = folder / "list_eval_partition.txt"
    listing.write_bytes(_lines(*lines))
    archives = {"img.zip": _zip(folder / "img.zip", images), "list_eval_partition.txt": listing}
    expected = [
        (f"img/{category}/id_{item:08d}/{n:02d}_1_front.jpg", item, split, f"id_{item:08d}")
        for n, (item, split, category) in enumerate(INSHOP_ITEMS)
    ]
    return archives, expected


BUILDERS = {"cub200": build_cub, "cars196": build_cars, "sop": build_sop, "inshop": build_inshop}


# ---- plumbing ---------------------------------------------------------------------------------


class _Counting(SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        self.requests.append(self.path)
        super().do_GET()


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str, list[str]]]:
    """A folder served on 127.0.0.1, its base URL, and the paths requested so far."""
    root = tmp_path / "www"
    root.mkdir()
    requests: list[str] = []
    handler = type("Handler", (_Counting,), {"requests": requests})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()
    httpd.server_close()


def _local_spec(name: str, archives: dict[str, Path], base_url: str | None) -> DatasetSpec:
    """The catalog entry with its archives replaced by the test's own (and their checksums)."""
    real = CATALOG[name]
    replaced = tuple(
        Archive(
            name=a.name,
            urls=(f"{base_url}/{a.name}",) if base_url else (),
            size=archives[a.name].stat().st_size,
            sha256=hashlib.sha256(archives[a.name].read_bytes()).hexdigest(),
            manual=a.manual,
        )
        for a in real.archives
    )
    return dataclasses.replace(real, archives=replaced)


def _rows(folder: Path) -> list[Row]:
    """The manifest as sorted rows, after checking it reads back and every image exists."""
    manifest = read_manifest(folder / "manifest.csv")
    assert all((folder / p).is_file() for p in manifest.paths)
    with open(folder / "manifest.csv", newline="", encoding="utf-8") as f:
        records = list(csv.DictReader(f))
    assert [r["path"] for r in records] == list(manifest.paths)
    return sorted((r["path"], int(r["label"]), r["split"], r["class_name"]) for r in records)


def _prepare(spec: DatasetSpec, tmp_path: Path, source: Path | None = None) -> tuple[Path, bool]:
    home = tmp_path / "home"
    return prepare_dataset(
        spec, home / spec.name, home / ".downloads" / spec.name, QUIET, source, FAST
    )


# ---- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cub200", "cars196", "sop"])
def test_download_builds_the_standard_manifest(name, tmp_path, http_root):
    root, url, requests = http_root
    archives, expected = BUILDERS[name](root)
    folder, did_work = _prepare(_local_spec(name, archives, url), tmp_path)
    assert did_work
    assert _rows(folder) == sorted(expected)
    assert sorted(requests) == sorted(f"/{a}" for a in archives)
    assert not (tmp_path / "home" / ".downloads" / name).exists()  # archives cleaned up
    sources = (folder / "sources.json").read_text()
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() in sources for p in archives.values())
    # A finished dataset is left alone: no request, no work.
    again, did_work = _prepare(_local_spec(name, archives, url), tmp_path)
    assert (again, did_work) == (folder, False)
    assert len(requests) == len(archives)


def test_splits_follow_the_paper(tmp_path, http_root):
    root, url, _ = http_root
    archives, _ = build_cars(root)
    folder, _ = _prepare(_local_spec("cars196", archives, url), tmp_path)
    manifest = read_manifest(folder / "manifest.csv")
    train = {n for n, s in zip(manifest.class_names, manifest.splits, strict=True) if s == "train"}
    test = {n for n, s in zip(manifest.class_names, manifest.splits, strict=True) if s == "test"}
    assert train == set(CARS_NAMES[:2]) and test == set(CARS_NAMES[2:])
    assert len(manifest) == len(CARS_IMAGES)


def test_inshop_needs_the_files_by_hand(tmp_path):
    spec = CATALOG["inshop"]
    with pytest.raises(PactlError, match=r"--from.*|by hand") as raised:
        _prepare(spec, tmp_path)
    assert "drive.google.com" in str(raised.value)


def test_inshop_from_a_drive_style_folder(tmp_path):
    archives, expected = build_inshop(tmp_path)
    drive = tmp_path / "drive" / "In-shop Clothes Retrieval Benchmark"
    (drive / "Img").mkdir(parents=True)
    (drive / "Eval").mkdir()
    shutil.copy(archives["img.zip"], drive / "Img" / "img.zip")
    shutil.copy(archives["list_eval_partition.txt"], drive / "Eval" / "list_eval_partition.txt")
    folder, _ = _prepare(_local_spec("inshop", archives, None), tmp_path, tmp_path / "drive")
    assert _rows(folder) == sorted(expected)
    manifest = read_manifest(folder / "manifest.csv")
    assert manifest.eval_splits() == ("query", "gallery")


def test_from_a_single_archive(tmp_path):
    archives, expected = build_cub(tmp_path)
    spec = _local_spec("cub200", archives, "http://127.0.0.1:9")  # never contacted
    folder, _ = _prepare(spec, tmp_path, archives["CUB_200_2011.tgz"])
    assert _rows(folder) == sorted(expected)
    assert archives["CUB_200_2011.tgz"].is_file()  # the user's file is not removed


def test_from_an_archives_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    archives, expected = build_cars(tmp_path / "mine")
    spec = _local_spec("cars196", archives, "http://127.0.0.1:9")
    folder, _ = _prepare(spec, tmp_path, tmp_path / "mine")
    assert _rows(folder) == sorted(expected)


@pytest.mark.parametrize("name", ["cub200", "cars196", "sop", "inshop"])
def test_from_an_extracted_folder_links_it(name, tmp_path):
    (tmp_path / "arch").mkdir()
    archives, expected = BUILDERS[name](tmp_path / "arch")
    mine = tmp_path / "by-hand" / "dataset"
    mine.mkdir(parents=True)
    for path in archives.values():  # unpacked with the standard library, as a user would
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as zf:
                zf.extractall(mine)
        elif path.suffix == ".tgz":
            with tarfile.open(path) as tf:
                tf.extractall(mine, filter="data")
        else:
            shutil.copy(path, mine / path.name)
    before = sorted(p.relative_to(mine) for p in mine.rglob("*"))
    folder, _ = _prepare(_local_spec(name, archives, None), tmp_path, mine)
    assert _rows(folder) == sorted((f"dataset/{p}", *rest) for p, *rest in expected)
    assert (folder / "dataset").resolve() == mine.resolve()
    assert sorted(p.relative_to(mine) for p in mine.rglob("*")) == before  # untouched


def test_from_a_repackaged_single_archive(tmp_path):
    """CARS196.zip (car_ims/ and cars_annos.mat under CARS196/) is read by its layout."""
    (tmp_path / "arch").mkdir()
    build_cars(tmp_path / "arch")
    files = {f"CARS196/car_ims/{i + 1:06d}.jpg": _jpeg(100 + i) for i in range(len(CARS_IMAGES))}
    files["CARS196/cars_annos.mat"] = (tmp_path / "arch" / "cars_annos.mat").read_bytes()
    repacked = _zip(tmp_path / "CARS196.zip", files)
    folder, _ = _prepare(CATALOG["cars196"], tmp_path, repacked)
    assert _rows(folder) == sorted(_cars_expected("CARS196/"))


def test_from_a_wrong_file_under_the_right_name_is_refused(tmp_path):
    archives, _ = build_cub(tmp_path)
    spec = _local_spec("cub200", archives, None)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "CUB_200_2011.tgz").write_bytes(b"not the archive")
    with pytest.raises(ChecksumError):
        _prepare(spec, tmp_path, tmp_path / "other" / "CUB_200_2011.tgz")


def test_traversal_archive_is_refused_end_to_end(tmp_path, http_root):
    root, url, _ = http_root
    archives, _ = build_cub(root)
    evil = {"CUB_200_2011/images.txt": b"1 a.jpg\n", "CUB_200_2011/../../../escaped.txt": b"x"}
    _tgz(archives["CUB_200_2011.tgz"], evil)
    with pytest.raises(UnsafeArchive):
        _prepare(_local_spec("cub200", archives, url), tmp_path)
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not (tmp_path / "home" / "cub200" / "manifest.csv").exists()


def test_missing_images_are_reported(tmp_path):
    archives, _ = build_sop(tmp_path)
    with zipfile.ZipFile(archives["Stanford_Online_Products.zip"]) as zf:
        kept = {n: zf.read(n) for n in zf.namelist() if not n.endswith("_1.JPG")}
    _zip(archives["Stanford_Online_Products.zip"], kept)
    with pytest.raises(PactlError, match="6 of 12 listed images are missing"):
        _prepare(
            _local_spec("sop", archives, None), tmp_path, archives["Stanford_Online_Products.zip"]
        )


def test_interrupted_preparation_is_finished_by_the_next_run(tmp_path, http_root):
    root, url, requests = http_root
    archives, expected = build_cars(root)
    spec = _local_spec("cars196", archives, url)
    annos = archives["cars_annos.mat"].read_bytes()
    archives["cars_annos.mat"].unlink()  # the second file is not there yet: the run fails
    with pytest.raises(PactlError, match="cars_annos.mat"):
        _prepare(spec, tmp_path)
    assert not (tmp_path / "home" / "cars196").exists()
    archives["cars_annos.mat"].write_bytes(annos)
    folder, did_work = _prepare(spec, tmp_path)
    assert did_work and _rows(folder) == sorted(expected)
    # car_ims.tgz came down once: the finished download was kept and not fetched again.
    assert requests.count("/car_ims.tgz") == 1


def test_catalog_prepare_and_status(tmp_path, http_root, monkeypatch):
    root, url, _ = http_root
    archives, _ = build_cub(root)
    monkeypatch.setenv("PACTL_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(CATALOG, "cub200", _local_spec("cub200", archives, url))
    status = {s.name: s for s in catalog.status_rows()}
    assert not status["cub200"].present and status["inshop"].manual
    folder, did_work = catalog.prepare("cub200", QUIET)
    assert did_work and folder == tmp_path / "home" / "datasets" / "cub200"
    assert {s.name: s for s in catalog.status_rows()}["cub200"].present
    assert catalog.prepare("cub200", QUIET) == (folder, False)


def test_catalog_entries_are_well_formed():
    hexdigits = re.compile(r"[0-9a-f]+")
    for name in ("cub200", "cars196", "sop", "inshop"):
        dataset = CATALOG[name]
        assert dataset.layout is not None and dataset.archives and dataset.homepage
        for a in dataset.archives:
            assert all(u.startswith(("http://", "https://")) for u in a.urls)
            assert a.urls or a.manual  # fetched, or the page says where to get it
            if a.sha256 is not None:
                assert len(a.sha256) == 64 and hexdigits.fullmatch(a.sha256)
            if a.md5 is not None:
                assert len(a.md5) == 32 and hexdigits.fullmatch(a.md5)
            assert a.size is None or a.size > 0
