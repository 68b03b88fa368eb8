"""Known datasets: name -> how to prepare it into `$PACTL_HOME/datasets/NAME/manifest.csv`.

The four benchmarks of the Proxy-Anchor paper are described by their published archives
(addresses, sizes, checksums, as far as each is published; see docs/datasets.md for which
are) and a layout that reads the extracted files; the bundled digits set prepares itself.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pactl.console import Reporter
from pactl.datasets.benchmarks import CARS, CUB, INSHOP, SOP, Layout
from pactl.datasets.digits import prepare_digits
from pactl.datasets.download import Archive, FetchOptions, Provenance, gather
from pactl.datasets.manifest import write_manifest
from pactl.errors import PactlError
from pactl.store.generations import atomic_write_text
from pactl.store.home import datasets_dir, writable_datasets_dir
from pactl.version import __version__

# prepare(target_folder, from_path_or_None, reporter) writes images and manifest.csv.
Prepare = Callable[[Path, "Path | None", Reporter], None]
SOURCES_FORMAT = 1  # version of sources.json


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    title: str
    classes: int
    images: int
    size: str  # download size, for `pactl download --list`
    licence: str
    prepare: Prepare | None = None  # a set that writes itself (bundled); else archives + layout
    offline: bool = False  # prepared without the network (so train may prepare it on demand)
    archives: tuple[Archive, ...] = ()  # the published files, fetched in this order
    layout: Layout | None = None  # reads the extracted files into manifest rows
    homepage: str = ""  # the dataset's own page: terms, citation, manual download

    @property
    def manual(self) -> bool:
        """True when some file has no direct address and must be fetched by hand (--from)."""
        return any(not a.urls for a in self.archives)


def _digits(target: Path, source: Path | None, reporter: Reporter) -> None:
    prepare_digits(target, reporter)


def _size_text(archives: Sequence[Archive]) -> str:
    sizes = [a.size for a in archives]
    if not sizes or any(s is None for s in sizes):
        return "not published"
    return f"{sum(s for s in sizes if s is not None) / 1e9:.2f} GB"


_HF_FGVC = "https://huggingface.co/datasets/XiN0919/FGVC/resolve"
_HF_CARS = f"{_HF_FGVC}/921e8dce38536cd5982739d85d5e9235d2cb2a76"
_STANFORD_CARS = (
    "http://imagenet.stanford.edu/internal/car196",
    "http://ai.stanford.edu/~jkrause/car196",
)

_CUB_ARCHIVES = (
    Archive(
        name="CUB_200_2011.tgz",
        urls=(
            "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1",
            "https://data.caltech.edu/api/records/65de6-vp158/files/CUB_200_2011.tgz/content",
            f"{_HF_FGVC}/main/CUB_200_2011.tgz",
            "https://s3.amazonaws.com/fast-ai-imageclas/CUB_200_2011.tgz",
        ),
        size=1_150_585_339,
        sha256="0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081",
        md5="97eceeb196236b17998738112f37df78",
        retired=("http://www.vision.caltech.edu/visipedia-data/CUB-200-2011/CUB_200_2011.tgz",),
    ),
)
_CARS_ARCHIVES = (
    Archive(
        name="car_ims.tgz",
        urls=(f"{_HF_CARS}/car_ims.tgz",),
        size=1_956_628_579,
        sha256="4d96e3e3e892c6b7e4a71959325c7de4804037d27ba5aaf1c756100fd94a5342",
        md5="d5c8f0aa497503f355e17dc7886c3f14",
        retired=tuple(f"{base}/car_ims.tgz" for base in _STANFORD_CARS),
    ),
    Archive(
        name="cars_annos.mat",
        urls=(f"{_HF_CARS}/cars_annos.mat",),
        size=394_471,
        md5="b407c6086d669747186bd1d764ff9dbc",
        retired=tuple(f"{base}/cars_annos.mat" for base in _STANFORD_CARS),
    ),
)
_SOP_ARCHIVES = (
    Archive(
        name="Stanford_Online_Products.zip",
        urls=(
            "http://ftp.cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
            "https://drive.usercontent.google.com/download?id=1TclrpQOF_ullUP99wk_gjGN8pKvtErG8"
            "&export=download&authuser=0&confirm=t",
        ),
        size=3_083_860_082,
        sha256="b04fa78210e69fab050ce73939550e1cd0f96890bdd98ec9fee732c3b756ef48",
        md5="7f73d41a2f44250d4779881525aea32e",
        retired=("ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",),
    ),
)
_INSHOP_PAGE = "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html"
_INSHOP_ARCHIVES = (
    Archive(
        name="img.zip",
        manual="https://drive.google.com/file/d/0B7EVK8r0v71pS2YxRE1QTFZzekU/view"
        "?resourcekey=0-2n-dbZygJiZdm0UbEaFRTA (In-shop Clothes Retrieval Benchmark/Img)",
    ),
    Archive(
        name="list_eval_partition.txt",
        manual="https://drive.google.com/file/d/0B7EVK8r0v71pYVBqLXpRVjhHeWM/view"
        "?resourcekey=0-rxJ2QcImN-IRo_Bv9QSXmg (In-shop Clothes Retrieval Benchmark/Eval)",
    ),
)

CATALOG: dict[str, DatasetSpec] = {
    "digits": DatasetSpec(
        name="digits",
        title="scikit-learn handwritten digits (8x8), classes 0-4 train, 5-9 test",
        classes=10,
        images=1797,
        size="bundled",
        licence="BSD-3-Clause (scikit-learn; UCI optical recognition of handwritten digits)",
        prepare=_digits,
        offline=True,
    ),
    "cub200": DatasetSpec(
        name="cub200",
        title="Caltech-UCSD Birds-200-2011, classes 1-100 train, 101-200 test",
        classes=200,
        images=11_788,
        size=_size_text(_CUB_ARCHIVES),
        licence="research use; terms on the Caltech DATA record",
        archives=_CUB_ARCHIVES,
        layout=CUB,
        homepage="https://data.caltech.edu/records/65de6-vp158",
    ),
    "cars196": DatasetSpec(
        name="cars196",
        title="Stanford Cars-196, classes 1-98 train, 99-196 test",
        classes=196,
        images=16_185,
        size=_size_text(_CARS_ARCHIVES),
        licence="non-commercial research (ImageNet terms); original host gone, mirror used",
        archives=_CARS_ARCHIVES,
        layout=CARS,
        homepage="https://ai.stanford.edu/~jkrause/cars/car_dataset.html",
    ),
    "sop": DatasetSpec(
        name="sop",
        title="Stanford Online Products, Ebay_train (11,318 products) / Ebay_test (11,316)",
        classes=22_634,
        images=120_053,
        size=_size_text(_SOP_ARCHIVES),
        licence="research use; see the Lifted Structure project page",
        archives=_SOP_ARCHIVES,
        layout=SOP,
        homepage="https://cvgl.stanford.edu/projects/lifted_struct/",
    ),
    "inshop": DatasetSpec(
        name="inshop",
        title="DeepFashion In-shop Clothes Retrieval, train / query / gallery",
        classes=7_982,
        images=52_712,
        size="manual download",
        licence="non-commercial research only; agreement on the DeepFashion page (--from)",
        archives=_INSHOP_ARCHIVES,
        layout=INSHOP,
        homepage=_INSHOP_PAGE,
    ),
}


def spec(name: str) -> DatasetSpec:
    try:
        return CATALOG[name]
    except KeyError:
        raise PactlError(
            f"unknown dataset {name!r}; known datasets: {', '.join(sorted(CATALOG))}"
        ) from None


def dataset_folder(name: str) -> Path:
    return datasets_dir() / name


def downloads_folder(name: str) -> Path:
    """Where archives being downloaded wait (and resume) until the dataset is prepared."""
    return datasets_dir() / ".downloads" / name


def is_prepared(name: str) -> bool:
    return (dataset_folder(name) / "manifest.csv").is_file()


def prepare(
    name: str,
    reporter: Reporter,
    source: Path | None = None,
    options: FetchOptions = FetchOptions(),
) -> tuple[Path, bool]:
    """Prepare dataset `name` once; returns (its folder, whether work was done)."""
    dataset = spec(name)
    if not is_prepared(name):  # a prepared set may be used from a read-only PACTL_HOME
        writable_datasets_dir()
    return prepare_dataset(
        dataset, dataset_folder(name), downloads_folder(name), reporter, source, options
    )


def prepare_dataset(
    dataset: DatasetSpec,
    folder: Path,
    downloads: Path,
    reporter: Reporter,
    source: Path | None = None,
    options: FetchOptions = FetchOptions(),
) -> tuple[Path, bool]:
    """Build `folder` (images + manifest.csv) unless it is already there."""
    if (folder / "manifest.csv").is_file():
        if downloads.exists():
            with contextlib.suppress(OSError):  # left by a run stopped right after it finished
                shutil.rmtree(downloads)
        return folder, False
    work = folder.with_name(f".{folder.name}.partial")
    try:
        if dataset.layout is None:
            if dataset.prepare is None:
                raise PactlError(f"dataset {dataset.name!r} has neither archives nor a preparer")
            _fresh(work)  # a half-written folder from an interrupted run is redone, not trusted
            dataset.prepare(work, source, reporter)
        else:
            _prepare_from_archives(
                dataset, dataset.layout, work, downloads, reporter, source, options
            )
    except Exception:
        if dataset.layout is None:
            shutil.rmtree(work, ignore_errors=True)  # redone from scratch by the next run anyway
        _drop_empty(work, downloads, downloads.parent)  # what a failure left holds nothing
        raise
    if folder.exists():
        shutil.rmtree(folder)
    work.rename(folder)
    if downloads.exists():
        shutil.rmtree(downloads)  # the archives are unpacked; keeping them doubles the disk use
    return folder, True


def _prepare_from_archives(
    dataset: DatasetSpec,
    layout: Layout,
    work: Path,
    downloads: Path,
    reporter: Reporter,
    source: Path | None,
    options: FetchOptions,
) -> None:
    if source is not None and source.is_dir() and layout.locate(source) is not None:
        _fresh(work)  # a linked folder replaces whatever an earlier run left
    else:
        # Kept across runs: each finished extraction has its marker, a cut one is redone.
        work.mkdir(parents=True, exist_ok=True)
        for entry in work.iterdir():
            if entry.is_symlink():
                entry.unlink()
    provenance = gather(
        dataset.archives,
        work,
        downloads,
        reporter,
        dataset=dataset.name,
        source=source,
        is_tree=lambda path: layout.locate(path) is not None,
        options=options,
    )
    rows = layout.parse(work)
    write_manifest(work / "manifest.csv", rows)
    _write_sources(work / "sources.json", dataset.name, provenance)
    reporter.log(f"{dataset.name}: {len(rows):,} images in the manifest")


def _drop_empty(*folders: Path) -> None:
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _fresh(work: Path) -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)


def _write_sources(path: Path, name: str, provenance: Sequence[Provenance]) -> None:
    """What the dataset was built from, with the digests measured on this machine."""
    files = []
    for p in provenance:
        entry: dict[str, object] = {"name": p.name, "origin": p.origin, "downloaded": p.downloaded}
        if p.digests is not None:
            entry.update(size=p.digests.size, sha256=p.digests.sha256, md5=p.digests.md5)
        files.append(entry)
    record = {"format": SOURCES_FORMAT, "pactl": __version__, "dataset": name, "files": files}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


@dataclass(frozen=True)
class Status:
    """One line of `pactl download --list`."""

    name: str
    title: str
    size: str
    classes: int
    images: int
    licence: str
    present: bool  # manifest.csv is in place
    manual: bool  # needs `--from` (licence click-through, no direct address)
    folder: Path


def status_rows() -> list[Status]:
    """Every catalog entry with whether it is already prepared on this machine."""
    return [
        Status(
            name=d.name,
            title=d.title,
            size=d.size,
            classes=d.classes,
            images=d.images,
            licence=d.licence,
            present=is_prepared(d.name),
            manual=d.manual,
            folder=dataset_folder(d.name),
        )
        for d in CATALOG.values()
    ]
