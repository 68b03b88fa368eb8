"""pactl from Python: train and evaluate, open a bundle and query it, add and delete its items,
embed a folder, build a bundle, load a checkpoint as a torch module; and the losses as torch
modules for a training loop of your own (pactl.losses, loaded on first use).

Every call here is the library call a `pactl` verb makes (pactl.verbs.index, pactl.index), with
the same files, locks and generations: an Index's add and delete take the bundle's writer lock
and switch one generation, as `pactl index --add/--delete` do, and its queries of image files
embed and search by the loop `pactl query` runs, so both give the same answers. Nothing is
printed unless `progress=True` (progress and messages on stderr, as the CLI shows them).

    import pactl
    index = pactl.open_index("runs/demo/index")
    for hit in index.query("photo.jpg", k=4)[0]:
        print(hit.rank, hit.path, hit.label, hit.score)
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.arguments import ARRAY, checked, unit_queries
from pactl.config import EmbedConfig, IndexConfig, ModelConfig
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError, UsageError
from pactl.results import Hit
from pactl.store.vectors_folder import Vectors

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from PIL import Image

    from pactl.index import Bundle
    from pactl.losses import (
        ContrastiveLoss,
        CosineContrastiveLoss,
        MultiSimilarityLoss,
        ProxyAnchorLoss,
        ProxyNCALoss,
        TripletLoss,
        TripletMarginLoss,
        optimizer_groups,
    )
    from pactl.verbs.query import QueryModel

    # A query: an image file's path, a PIL image, or a tensor of one image (3, S, S) or a
    # batch (B, 3, S, S) already preprocessed as Index.preprocess does.
    Query = str | Path | Image.Image | torch.Tensor

__all__ = [  # pactl/__init__.py hands these on lazily (tests/test_layout.py keeps the two equal)
    "ContrastiveLoss",
    "CosineContrastiveLoss",
    "Hit",
    "Index",
    "MultiSimilarityLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "Run",
    "TripletLoss",
    "TripletMarginLoss",
    "Vectors",
    "build_index",
    "embed_folder",
    "evaluate",
    "load_model",
    "open_index",
    "optimizer_groups",
    "read_vectors",
    "train",
]

# From pactl.losses on first use (torch with them): a vectors folder indexes without torch.
_LOSSES = (
    "ContrastiveLoss",
    "CosineContrastiveLoss",
    "MultiSimilarityLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "TripletLoss",
    "TripletMarginLoss",
    "optimizer_groups",
)


def __getattr__(name: str) -> Any:
    if name in _LOSSES:
        return getattr(importlib.import_module("pactl.losses"), name)
    raise AttributeError(f"module 'pactl.api' has no attribute {name!r}")


def _reporter(progress: bool) -> Reporter:
    return Reporter() if progress else QUIET


def _model_source(model: str | Path | ModelConfig) -> Path | ModelConfig:
    """A checkpoint's path, or a backbone's ModelConfig (embedding_dim 0: its pooled features),
    checked as `--checkpoint` and `--backbone` are."""
    if isinstance(model, ModelConfig):
        from pactl.model import check_model_config

        check_model_config(model, trained=False)
        return model
    path = Path(model)
    if not path.is_file():
        raise PactlError(f"checkpoint {path} not found")
    return path


class Index:
    """An open bundle and the network that made it (opened once; queries reuse both).

    Use open_index(). `bundle` is the pactl.index.Bundle as loaded; add, delete and compact
    write a new generation of the folder and load it again. A bundle of another tool's vectors
    records no network: search() answers, and what would embed images says what to pass.
    """

    @checked()
    def __init__(
        self,
        path: str | Path,
        checkpoint: str | Path | ModelConfig | None = None,
        device: str = "auto",
        faiss_device: str = "auto",
        progress: bool = False,
    ) -> None:
        from pactl.index import load_bundle_or_set
        from pactl.verbs.lineage import records_network
        from pactl.verbs.query import with_network

        self.path = Path(path)
        self.device_name, self.faiss_device = device, faiss_device
        self.reporter = _reporter(progress)
        source = _model_source(checkpoint) if checkpoint is not None else None
        self._bundle = load_bundle_or_set(self.path, faiss_device=faiss_device)
        self.opened: QueryModel | None = None  # None: no network recorded nor given
        if source is not None or records_network(self._bundle.meta):
            self.opened = with_network(self._bundle, self.path, source, device)
        self._transform: Any = None

    def __len__(self) -> int:
        """The live (not deleted) items."""
        return self.bundle.live_count

    def __repr__(self) -> str:
        return f"Index({str(self.path)!r}, {len(self)} items, dimension {self.dimension})"

    @property
    def bundle(self) -> Bundle:
        """The pactl.index.Bundle as loaded (reloaded after add, delete and compact)."""
        return self._bundle

    def _network(self, who: str = "Index.query") -> QueryModel:
        """The bundle with its network; one line for a bundle that records none."""
        from pactl.verbs.lineage import no_network
        from pactl.verbs.query import OPEN_INSTEAD

        if self.opened is None:
            raise no_network(self.path, who, OPEN_INSTEAD)
        return self.opened

    @property
    def model(self) -> torch.nn.Module:
        """The bundle's network, on `device`."""
        return self._network("Index.model").model

    @property
    def model_config(self) -> ModelConfig:
        return self._network("Index.model_config").config

    @property
    def device(self) -> torch.device:
        return self._network("Index.device").device

    @property
    def dimension(self) -> int:
        return int(self.bundle.index.d)

    @property
    def meta(self) -> dict[str, Any]:
        """The bundle's meta.json."""
        return self.bundle.meta

    @checked()
    def query(
        self,
        images: Query | Sequence[Query],
        k: int = 4,
        exclude_self: bool = False,
        rescore: int | None = None,
    ) -> list[list[Hit]]:
        """The top-k hits of each query image, best first, one list per image in input order
        (a (B, 3, S, S) tensor counts B images). `exclude_self`: a query that is itself an
        indexed file (by path) is left out of its own hits, as `pactl query --exclude-self`
        does. `rescore`: a binary bundle's candidates per hit rescored by cosine, as `pactl
        query --rescore` (0: Hamming order). An image file that cannot be read is a PactlError
        naming it."""
        self._network()
        queries = _as_list(images)
        is_file = [isinstance(q, str | Path) for q in queries]
        files = [i for i, named in enumerate(is_file) if named]
        pictures = [i for i, named in enumerate(is_file) if not named]
        out: list[list[Hit]] = [[] for _ in queries]
        found = self._query_files([Path(queries[i]) for i in files], k, exclude_self, rescore)
        for i, row in zip(files, found, strict=True):
            out[i] = row
        if pictures:
            vectors = self.vectors_of([queries[i] for i in pictures])
            names = [_name_of(queries[i], i) for i in pictures]
            for i, row in zip(pictures, self.search(vectors, k, names, rescore), strict=True):
                out[i] = row
        return out

    def _query_files(
        self, files: list[Path], k: int, exclude_self: bool, rescore: int | None = None
    ) -> list[list[Hit]]:
        from pactl.verbs.query import answer_chunks

        rows: list[list[Hit]] = []
        opened = self._network()
        found = answer_chunks(opened, files, k, exclude_self, self.reporter, rescore=rescore)
        for chunk in found:
            if chunk.failed:
                name, reason = chunk.failed[0]
                raise PactlError(f"unreadable query image {name}: {reason}")
            rows += chunk.hits
        return rows

    @checked(vectors=ARRAY)
    def search(
        self,
        vectors: np.ndarray,
        k: int = 4,
        names: Sequence[str] | None = None,
        rescore: int | None = None,
    ) -> list[list[Hit]]:
        """The top-k hits of each row of `vectors` ((N, dimension), from this bundle's network;
        each row is scaled to length 1, so scores are cosines, and a row holding NaN or Inf or
        all zeros is refused); `names` become the hits' `query` (default: the row numbers);
        `rescore` as in query."""
        from pactl.index.search import hits, search

        x = unit_queries(vectors, self.dimension)  # NaN refused, lengths made 1
        labels = list(names) if names is not None else [str(i) for i in range(len(x))]
        scores, ids = search(self.bundle, x, k, rescore=rescore)
        return hits(self.bundle, labels, scores, ids)

    @checked()
    def vectors_of(self, images: Sequence[Any]) -> np.ndarray:
        """The unit vectors of PIL images or preprocessed tensors, one forward pass, as
        `pactl serve` embeds a request's images: (N, dimension) float32."""
        import torch

        from pactl.embed import embed_decoded

        self._network("Index.vectors_of")
        batch = [self.preprocess(q) if not isinstance(q, torch.Tensor) else q for q in images]
        stacked = torch.cat([t if t.dim() == 4 else t.unsqueeze(0) for t in batch])
        side = self.model_config.image_size
        if stacked.dim() != 4 or tuple(stacked.shape[1:]) != (3, side, side):
            raise PactlError(
                f"query tensors must be (3, {side}, {side}) or (B, 3, {side}, {side}) as "
                f"Index.preprocess makes them, not {tuple(stacked.shape)}"
            )
        return embed_decoded(self.model, stacked.float(), self.model_config, self.device)

    @checked()
    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """A PIL image as the network takes it: upright 8-bit RGB (transparency on white),
        resized, centre-cropped and normalised as the bundle's model_config says: (3, S, S)."""
        from pactl.images import to_rgb
        from pactl.transforms import build_transform

        if self._transform is None:
            cfg = self._network("Index.preprocess").config
            assert cfg.mean is not None and cfg.std is not None
            self._transform = build_transform(
                cfg.image_size,
                cfg.resize_size or cfg.image_size,
                cfg.mean,
                cfg.std,
                train=False,
                interpolation=cfg.interpolation or "bilinear",
            )
        return self._transform(to_rgb(image))

    @checked()
    def add(self, source: str | Path, split: str | None = None, workers: int = 0) -> dict[str, int]:
        """`pactl index SOURCE --add BUNDLE`: embed the images of `source` the bundle lacks (or
        holds from before their file changed) and append them, under the bundle's writer lock,
        in one new generation. Returns {"added", "replaced", "count"}."""
        from pactl.verbs.add import add_to_index

        config = EmbedConfig(device=self.device_name, workers=workers)
        done = add_to_index(str(source), self.path, split, config, self.reporter)
        self.reload()
        return {key: int(value) for key, value in done.items()}

    @checked()
    def delete(self, ids: Sequence[int] = (), paths: Sequence[str | Path] = ()) -> int:
        """`pactl index BUNDLE --delete`: items deleted by id or path (searches skip them at
        once); returns how many were not deleted already."""
        from pactl.index import delete_items

        named = [str(p) for p in paths]
        done = delete_items(self.path, [int(i) for i in ids], named, self.reporter)
        self.reload()
        return done

    def compact(self) -> dict[str, int]:
        """`pactl index BUNDLE --compact`: deleted items removed from the index for good."""
        from pactl.index import compact_bundle

        done = compact_bundle(self.path, self.reporter)
        self.reload()
        return {key: int(value) for key, value in done.items() if isinstance(value, int)}

    def reload(self) -> None:
        """Load the bundle's current generation (another process may have written one)."""
        from pactl.index import load_bundle_or_set

        self._bundle = load_bundle_or_set(self.path, faiss_device=self.faiss_device)
        if self.opened is not None:
            self.opened.bundle = self._bundle


def _as_list(images: Any) -> list[Any]:
    """One query or a sequence of them as a list, a (B, 3, S, S) tensor as its B images."""
    one = isinstance(images, str | Path) or not isinstance(images, Sequence)
    out = []
    for query in [images] if one else images:
        batch = getattr(query, "dim", None) is not None and query.dim() == 4
        out += list(query) if batch else [query]
    return out


def _name_of(query: Any, position: int) -> str:
    """A hit's `query` for an image given in memory: its file name when PIL knows one."""
    name = getattr(query, "filename", "")
    return str(name) if name else f"<image {position}>"


@checked()
def open_index(
    path: str | Path,
    checkpoint: str | Path | ModelConfig | None = None,
    device: str = "auto",
    faiss_device: str = "auto",
    progress: bool = False,
) -> Index:
    """Open a bundle (`pactl index`'s output) and its network, as `pactl query --index` does:
    the checkpoint recorded in the bundle unless `checkpoint` (a file, or a backbone's
    ModelConfig) is given, refused when its weights are not the ones that made the bundle. A
    bundle of another tool's vectors records no network: it opens for Index.search, and
    `checkpoint` (then taken on your word, of its dimension) lets Index.query embed images."""
    return Index(path, checkpoint, device, faiss_device, progress)


@checked()
def embed_folder(
    source: str | Path,
    model: str | Path | ModelConfig,
    out: str | Path = "vectors",
    split: str | None = None,
    device: str = "auto",
    batch_size: int = 128,
    workers: int = 0,
    progress: bool = False,
) -> Vectors:
    """`pactl embed SOURCE --checkpoint MODEL --out OUT`: a folder of images (class
    sub-folders give labels), a dataset name or a CSV into the vectors folder `out`; a second
    run embeds only new or changed files. `model` is a checkpoint (best.pt) or a backbone's
    ModelConfig (the pooled features of its published weights, no training)."""
    from pactl.verbs.embed import embed_source

    reporter = _reporter(progress)
    config = EmbedConfig(device=device, batch_size=batch_size, workers=workers)
    embed_source(str(source), _model_source(model), Path(out), split, config, reporter)
    return read_vectors(out)


@checked()
def read_vectors(folder: str | Path) -> Vectors:
    """The vectors, items and meta of an embed output folder (`pactl embed --out`), its shards
    joined in shard order: the Vectors the library's own reader returns."""
    from pactl.verbs.vector_sources import gather_vectors

    return gather_vectors(Path(folder))


@checked()
def build_index(
    vectors: str | Path,
    out: str | Path | None = None,
    factory: str | None = None,
    target_recall: float = 0.95,
    overwrite: bool = False,
    progress: bool = False,
    binary: bool | None = None,
    bits: int = 0,
    rotation: str = "auto",
    rescore: int | None = None,
) -> Path:
    """`pactl index VECTORS --out OUT`: a bundle from an embed output folder; returns its
    folder (default: runs/<run>/index beside the checkpoint, else ./index). `binary`, `bits`,
    `rotation`, `rescore`: `--binary` and its options (binary by default for the vectors of a
    network trained with --bits)."""
    from pactl.config import check
    from pactl.verbs.index import index_vectors

    config = IndexConfig(
        factory=factory,
        target_recall=target_recall,
        binary=binary,
        bits=bits,
        rotation=rotation,
        rescore=rescore,
    )
    check(config, lambda field: field, PactlError)
    bundle, _ = index_vectors(
        Path(vectors), Path(out) if out is not None else None, config, _reporter(progress),
        overwrite=overwrite,
    )  # fmt: skip
    return bundle


@checked()
def load_model(checkpoint: str | Path) -> torch.nn.Module:
    """A checkpoint (best.pt or checkpoint.pt) as a torch.nn.Module in eval mode on the CPU:
    (B, 3, S, S) images preprocessed as its model_config says -> (B, D) unit vectors. The
    module's `pactl_config` is that ModelConfig."""
    from pactl.checkpoint import load_model as load

    module, config, _ = load(Path(checkpoint))
    module.pactl_config = config  # type: ignore[assignment]
    return module


@dataclass(frozen=True)
class Run:
    """A run folder pactl.train() wrote or continued (`runs/<name>/`, as `pactl train`)."""

    folder: Path
    best_epoch: int  # the epoch best.pt holds
    best_metrics: dict[str, float]  # its metrics: Recall@K, MAP@R, ... on the test classes
    selection: str  # what chose that epoch: val (validation classes), test or last

    @property
    def checkpoint(self) -> Path:
        """best.pt: the network to embed, index and query with."""
        return self.folder / "best.pt"

    @property
    def metrics(self) -> pd.DataFrame:
        """metrics.csv as a pandas DataFrame: a row an epoch, from epoch 0 (before training)."""
        from pactl.runs import read_metrics

        try:
            import pandas as pd
        except ImportError:
            raise PactlError("Run.metrics needs pandas: pip install 'pactl[research]'") from None
        frame = pd.DataFrame(read_metrics(self.folder / "metrics.csv"))
        return frame.astype({"epoch": int}) if "epoch" in frame else frame


def _keyword(field: str) -> str:
    """How an error names what train() was given: by its keyword (the run to continue as
    `resume=`, a setting by its field's name)."""
    return "resume=" if field == "resume" else field


@checked()
def train(
    source: str | Path | None = None,
    *,
    name: str | None = None,
    preset: str | None = None,
    overwrite: bool = False,
    resume: str | Path | None = None,
    progress: bool = False,
    **settings: Any,
) -> Run:
    """`pactl train SOURCE --name NAME ...`: the settings are `pactl train`'s, by the field names
    of pactl.config.ModelConfig and TrainConfig (`embedding_dim=64, epochs=3, lr=1e-4`;
    `time_budget` in seconds or as `"15m"`), settled by the function the CLI and the sweeps use
    (pactl.recipe.settle). `resume`: a run folder or "latest", continued with its own settings
    (only epochs, device, workers and precision may change). Returns the Run; an unknown
    setting, a wrong value or a source that is not there is a PactlError before any work, the
    line `pactl train` prints for the same mistake (pactl.verbs.train.start_run, the one start
    of a run for both), naming the keyword where the CLI names the option."""
    from pactl.verbs import train as verb

    reporter = _reporter(progress)
    start = verb.start_run(
        source, settings, reporter, preset=preset, name=name, resume=resume, words=_keyword
    )
    result = verb.fit_run(start, reporter, overwrite)
    return Run(result.run_dir, result.best_epoch, dict(result.best_metrics), result.selection)


@checked()
def evaluate(
    checkpoint: str | Path | ModelConfig,
    source: str | Path | None = None,
    ks: Sequence[int] | None = None,
    device: str = "auto",
    workers: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """`pactl eval SOURCE --checkpoint CHECKPOINT`: Recall@K, MAP@R, R-precision and NMI of a
    checkpoint's network (or of a backbone's ModelConfig, untrained) on the test split of
    `source` (default: the dataset the checkpoint's run trained on). `ks` default: the
    dataset's preset's, else 1, 2, 4, 8. Writes no report."""
    from pactl.config import TrainConfig, check
    from pactl.verbs.evaluate import default_ks, eval_checkpoint, run_source
    from pactl.verbs.sources import check_source

    model = _model_source(checkpoint)
    follow_links = False
    if source is None:
        found = run_source(model) if isinstance(model, Path) else None
        if found is None:
            raise UsageError("give the dataset, folder or CSV to evaluate on")
        source, follow_links = found
    check_source(str(source))
    if ks is None:
        ks = default_ks(str(source))
    elif isinstance(ks, Sequence) and not isinstance(ks, str):
        ks = tuple(ks)
    asked = TrainConfig(eval_ks=ks, device=device, workers=workers)
    cfg = check(asked, lambda field: {"eval_ks": "ks"}.get(field, field), UsageError)
    reporter = _reporter(progress)
    metrics, _ = eval_checkpoint(
        str(source), model, cfg.eval_ks, device, workers, reporter, follow_links
    )
    return metrics
