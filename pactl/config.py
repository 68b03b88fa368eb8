"""Frozen configuration records, each setting declared once.

A setting is one field: its default, its rule (pactl.rules), its help (the `pactl train` option's
help text, or what the field means where no option sets it), its option's name where that is not
`--field-name`, and whether `--resume` may change it (`setting`). The checks, the CLI's choices,
its option names and what `--resume` refuses are read from these declarations.

Every artifact pactl writes carries the config that made it (config.json, checkpoint.pt,
meta.json), so each can be rebuilt from its own metadata. The presets, and the recipe chosen for
your data and device, are pactl.recipe's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pactl.errors import PactlError
from pactl.rules import (
    COMMIT_EVERY,
    INTERPOLATIONS,
    MAX_BATCH_SIZE,
    MAX_BITS,
    MAX_COMMIT_EVERY,
    MAX_DIMENSION,
    MAX_EMBEDDING_DIM,
    MAX_EPOCHS,
    MAX_IMAGE_SIZE,
    MAX_K,
    MAX_RESIZE_SIZE,
    MAX_SEED,
    MAX_WORKERS,
    MIN_IMAGE_SIZE,
    Rule,
    choice,
    code_bits,
    device,
    flag,
    integer,
    integers,
    label_noise,
    number,
    numbers,
    optional,
    share_or_auto,
    shown,
    text,
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The choices of the settings that name one of several ways; each registry that implements
# them (pactl.losses.LOSSES, pactl.transforms.AUGMENTS, pactl.model.POOLINGS,
# pactl.training.samplers.SAMPLERS, pactl.runtime.AMP) holds exactly these (tests/test_layout.py).
LOSS_NAMES = ("proxy_anchor", "proxy_nca", "multi_similarity", "triplet", "contrastive")
AUGMENT_NAMES = ("rrc_flip", "flip", "light", "none")
POOLING_NAMES = ("avg+max", "avg", "max", "token")
SAMPLER_NAMES = ("shuffle", "m_per_class")
AMP_NAMES = ("none", "bf16", "fp16")
CODE_PROXIES_NAMES = ("learned", "hadamard")  # pactl.codes.learned.CODE_PROXIES
ON_DISK_NAMES = ("auto", "yes", "no")  # pactl.index.ondisk.ON_DISK_CHOICES
FAISS_DEVICE_NAMES = ("auto", "cpu", "gpu")  # pactl.index.gpus.FAISS_DEVICES
ROTATION_NAMES = ("auto", "none", "itq", "lsh")  # pactl.codes.rotation.ROTATION_CHOICES
# pactl.verbs.audit.AuditConfig's: what ranks the suspected labels, what the classes' witness
# holds an item against (here, where `pactl --help` reads them without numpy)
AUDIT_SCORE_NAMES = ("blend", "classes", "neighbours")
AUDIT_CENTRES_NAMES = ("means", "proxies")
AUDIT_FEATURES_NAMES = ("auto", "pretrained", "thumbnails")  # pactl.audit.features.FEATURES
REQUIRED: Any = dataclasses.MISSING  # setting(REQUIRED, ...): a field every record is given


def setting(
    default: Any,
    rule: Rule,
    help: str,
    *,
    option: str | None = None,
    cli: bool = True,
    resume: bool = False,
) -> Any:
    """A config field declared once: `help` is its option's help (or its meaning where `cli` is
    False: no option sets it), `option` its option's name where that is not --field-name, and
    `resume` whether `pactl train --resume` may change it. A `default` of REQUIRED: none."""
    info = {"rule": rule, "help": help, "option": option, "cli": cli, "resume": resume}
    return field(default=default, metadata=info)


@dataclass(frozen=True)
class ModelConfig:
    backbone: str = setting(
        "bn_inception", text(), "small, bn_inception, resnet50, timm:<model>, ... (pactl list "
        "backbones)."
    )  # fmt: skip
    weights: str = setting(
        "imagenet", text(), "none | imagenet | PATH (a state_dict file, .pth or .safetensors)."
    )
    embedding_dim: int = setting(
        512, integer(0, MAX_EMBEDDING_DIM), "Embedding size.", option="--dim"
    )  # the L2-normalised embedding's size; 0: the pooled features
    image_size: int = setting(
        224, integer(MIN_IMAGE_SIZE, MAX_IMAGE_SIZE), "Crop size the network sees."
    )
    resize_size: int | None = setting(
        None, optional(integer(MIN_IMAGE_SIZE, MAX_RESIZE_SIZE)), "Test-time resize before crop."
    )  # None: image_size divided by the crop fraction the backbone's weights were evaluated with
    mean: tuple[float, ...] | None = setting(
        None, optional(numbers(3, number(0, 1))),
        "Per-channel normalisation in [0, 1] units; None: what the backbone's weights expect.",
        cli=False,
    )  # fmt: skip
    std: tuple[float, ...] | None = setting(
        None, optional(numbers(3, number(0, 1, above=True))),
        "Per-channel scale in [0, 1] units; None: what the backbone's weights expect.",
        cli=False,
    )  # fmt: skip
    interpolation: str | None = setting(
        None, optional(choice(*INTERPOLATIONS)),
        "Resize filter (bilinear | bicubic); None: the backbone's.", cli=False,
    )  # fmt: skip
    pooling: str = setting(
        "avg+max", choice(*POOLING_NAMES),
        "Feature pooling: avg+max (summed, the official head; the default), avg, max, token (a "
        "timm transformer's class token).",
    )  # fmt: skip
    dimension: int | None = setting(
        None, optional(integer(1, MAX_DIMENSION)),
        "The vectors' size, filled in when the network is built.", cli=False,
    )  # fmt: skip
    bits: int = setting(
        0, code_bits(MAX_BITS),
        "Learn N-bit binary codes with the loss: the network's vectors are N-d, their signs its "
        "codes, its metrics those of the codes by Hamming distance, and pactl index of its "
        "vectors makes a binary index (0: float vectors; N a multiple of 8; sets --dim).",
    )  # fmt: skip  # pactl.codes.learned


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = setting(60, integer(1, MAX_EPOCHS), "Epochs to train.", resume=True)
    time_budget: float = setting(
        0.0, number(0, 365 * 86400),
        "Fit the epochs (and the lr decay, in proportion) to this wall-clock budget from the "
        "run's measured step and evaluation times: 15m, 900s, 1.5h. Not with --epochs.",
    )  # fmt: skip  # seconds (pactl.budget); 0: off
    batch_size: int = setting(
        180, integer(2, MAX_BATCH_SIZE), "Global batch size (2 at least: pairs to compare)."
    )
    lr: float = setting(1e-4, number(0, 10, above=True), "AdamW learning rate.")
    weight_decay: float = setting(1e-4, number(0, 10), "AdamW weight decay.")
    proxy_lr_mult: float = setting(
        100.0, number(0, 1e6, above=True), "Proxies' lr multiplier."
    )  # proxies learn this much faster than the network (pactl.training.trainer.param_groups)
    alpha: float = setting(32.0, number(0, 1e4, above=True), "Proxy-Anchor alpha.")
    delta: float = setting(0.1, number(0, 1), "Proxy-Anchor margin delta.")
    loss: str = setting("proxy_anchor", choice(*LOSS_NAMES), "Loss to train with.")
    code_proxies: str = setting(
        "learned", choice(*CODE_PROXIES_NAMES),
        "With --bits: learned (the loss's own proxies, pulled to codes with the vectors by "
        "--quantization) or hadamard (fixed binary proxies: CSQ's hash centres from a Hadamard "
        "matrix, with OrthoHash's cross-entropy over cosines with a margin).",
    )  # fmt: skip  # pactl.codes.learned.CODE_PROXIES
    quantization: float = setting(
        0.5, number(0, 1e4),
        "With --bits: weight of the term pulling each vector (and learned proxy) to its code, "
        "1 - cos(v, sign(v)).",
    )  # fmt: skip
    warmup_epochs: int = setting(1, integer(0, MAX_EPOCHS), "Head-only epochs.")
    lr_decay_step: int = setting(10, integer(1, MAX_EPOCHS), "Epochs between learning-rate decays.")
    lr_decay_gamma: float = setting(
        0.5, number(0, 1, above=True), "Factor of each learning-rate decay."
    )
    freeze_bn: bool | None = setting(
        None, optional(flag()),
        "Keep BatchNorm statistics fixed. Default: frozen for pretrained weights (as the paper "
        "does for CUB and Cars), training with --weights none (frozen random statistics make "
        "the network collapse).",
    )  # fmt: skip
    sync_bn: bool | None = setting(
        None, optional(flag()),
        "SyncBatchNorm under torchrun (default: on when BatchNorm trains on GPUs).",
    )  # fmt: skip
    grad_clip: float = setting(
        10.0, number(0, 1e6),
        "Clip gradient values (as the official loop does); 0 disables.", cli=False,
    )  # fmt: skip
    augment: str = setting(
        "rrc_flip", choice(*AUGMENT_NAMES),
        "Train-time augmentation: rrc_flip (random resized crop + flip, the paper's), flip (the "
        "test transform's view, mirrored half the time), light (small affine jitter, no flip: "
        "glyphs, digits), none.",
    )  # fmt: skip
    crop_scale: float = setting(
        0.08, number(0, 1, above=True),
        "rrc_flip's smallest crop as a share of the image's area (the paper's 0.08; 1.0 keeps "
        "whole images, only reshaped).",
    )  # fmt: skip
    sampler: str = setting("shuffle", choice(*SAMPLER_NAMES), "shuffle | m_per_class.")
    m_per_class: int = setting(
        4, integer(1, MAX_BATCH_SIZE), "Images per class (m_per_class).", option="--m"
    )
    label_noise: str = setting(
        "0", label_noise(),
        "Corrupt this share of the training labels, seeded by --seed, as PRISM's protocol does: "
        "0.2 or 0.2:symmetric (each picked image gets another train class, drawn uniformly), "
        "0.5:small_cluster (a class cut into small groups, each moved whole to another class). "
        "Validation and test labels are never changed; the run lists the changes in noise.csv.",
    )  # fmt: skip  # RATE in [0, 1) (pactl.training.noise)
    drop_noisy: float | str = setting(
        0.0, share_or_auto(),
        "Keep this share of each batch out of the loss from the second epoch on: the images "
        "whose label their class's mean and their nearest training images (a memory of each "
        "image's last embedding) doubt most, as PRISM does (0: off). auto: each epoch, the "
        "share of each class its estimated noise rate says (Confident Learning's count on "
        "that memory), recorded in metrics.csv.",
    )  # fmt: skip  # pactl.training.robust
    eval_ks: tuple[int, ...] = setting(
        (1, 2, 4, 8), integers(32, 1, MAX_K), "Recall@K reported each epoch.", cli=False
    )
    eval_every: int = setting(
        1, integer(1, MAX_EPOCHS),
        "Evaluate every this many epochs (and always after the last).", cli=False,
    )  # fmt: skip
    val_classes: float = setting(
        0.15, number(0, 0.9),
        "Share of the train classes held out as validation classes that choose best.pt "
        "(default 0.15 for your own data; 0: none, best.pt is the last epoch). Presets keep "
        "their own choice (the paper's: best test Recall@1) unless given.",
    )  # fmt: skip
    selection: str = setting(
        "val", choice("val", "test", "last"),
        "Split whose Recall@1 chooses best.pt: val | test | last.", cli=False,
    )  # fmt: skip
    seed: int = setting(0, integer(0, MAX_SEED), "Seeds initialisation, sampling and augmentation.")
    precision: float = setting(
        0.99, number(0, 1, above=True),
        "Same-item precision best.pt's calibrated cosine threshold reaches (0.99).",
        resume=True,
    )  # fmt: skip
    workers: int = setting(4, integer(0, MAX_WORKERS), "DataLoader workers.", resume=True)
    device: str = setting(
        "auto", device(), "auto | cpu | cuda | cuda:N (default: auto).", resume=True
    )
    amp: str = setting(
        "none", choice(*AMP_NAMES), "Mixed precision autocast."
    )  # autocast; the loss always runs in float32
    channels_last: bool = setting(
        True, flag(), "NHWC memory layout for convolutions (default: on)."
    )  # much faster on CPUs too
    compile: bool = setting(False, flag(), "torch.compile the model (default: off).")
    follow_links: bool = setting(
        False, flag(),
        "Follow links that lead out of the folder or the CSV's folder (default: skipped / "
        "refused). Kept for --resume.",
    )  # fmt: skip
    tensorboard: bool = setting(
        False, flag(),
        "Log loss, lr and the metrics per epoch to runs/<run>/tensorboard (needs pip install "
        "'pactl[tensorboard]').",
    )  # fmt: skip


@dataclass(frozen=True)
class IndexConfig:
    factory: str | None = setting(
        None, optional(text()), "A FAISS factory string; None chooses by collection size."
    )
    target_recall: float = setting(
        0.95, number(0, 1), "Recall@10 against exact search the tuned index must reach."
    )
    memory_budget_gb: float = setting(
        8.0,
        number(0, 1e6, above=True),
        "The default index must fit in this much memory.",
        option="--memory-budget",
    )
    query_budget_ms: float = setting(
        10.0, number(0, 1e6, above=True),
        "Milliseconds a query may take (batched) at the tuned search setting.",
    )  # fmt: skip
    on_disk: str = setting(
        "auto", choice(*ON_DISK_NAMES),
        "Shards' IVF lists merged on disk (auto: over budget).",
    )  # fmt: skip
    faiss_device: str = setting(
        "auto", choice(*FAISS_DEVICE_NAMES),
        "Where FAISS trains, adds and searches exactly.",
    )  # fmt: skip
    binary: bool | None = setting(
        None, optional(flag()),
        "Index binary codes, every hit rescored by cosine on the float vectors (None: when "
        "the network makes codes, pactl train --bits).",
    )  # fmt: skip  # pactl.index.binary
    bits: int = setting(
        0, integer(0, MAX_DIMENSION),
        "Bits per code, a multiple of 8 (0: the vectors' dimension, or the network's bits).",
    )  # fmt: skip
    rotation: str = setting(
        "auto", choice(*ROTATION_NAMES),
        "The map before the signs; auto: measured (pactl.codes.rotation.ROTATION_CHOICES).",
    )  # fmt: skip
    rescore: int | None = setting(
        None, optional(integer(0, 10_000)),
        "Candidates per hit of lossy codes (binary, PQ, SQ) rescored by cosine on the float "
        "vectors the bundle keeps (0: the codes' order, no copy kept; None: the fewest "
        "reaching target_recall, measured).",
    )  # fmt: skip


@dataclass(frozen=True)
class EmbedConfig:
    """How images become vectors: the settings `pactl embed`, `pactl index IMAGES`, --add and
    the Python API share, given once and handed down whole."""

    device: str = setting(
        "auto", device(), "Where the network runs: auto | cpu | mps | cuda | cuda:N."
    )
    batch_size: int = setting(128, integer(1, MAX_BATCH_SIZE), "Images per forward pass.")
    workers: int = setting(0, integer(0, MAX_WORKERS), "DataLoader worker processes.")
    amp: str = setting("none", choice(*AMP_NAMES), "Mixed precision autocast.")
    commit_every: int = setting(
        COMMIT_EVERY, integer(1, MAX_COMMIT_EVERY),
        "Images between progress commits: a stopped embed goes on from the last one.",
    )  # fmt: skip  # a kill loses at most these
    gpu_decode: bool = setting(False, flag(), "Decode JPEGs on a CUDA device (nvJPEG).")
    follow_links: bool = setting(False, flag(), "Follow links that lead out of the source folder.")


ENGINE_NAMES = ("local", "ray")  # pactl.engines: where embed and index run their shards
MAX_ENGINE_SHARDS = 99_999  # pactl.embed.folder.MAX_SHARDS: shard names have five digits


@dataclass(frozen=True)
class EngineConfig:
    """Where `pactl embed` and `pactl index` do their work: in this process (local), or as one
    task per shard on a Ray cluster (pactl.engines)."""

    engine: str = setting("local", choice(*ENGINE_NAMES), "Run here (local) or on Ray (ray).")
    ray_address: str | None = setting(
        None, optional(text()),
        "With --engine ray: the cluster to join (host:port of its head); default: a Ray "
        "started on this machine for the run.",
    )  # fmt: skip
    shards: int = setting(
        0, integer(0, MAX_ENGINE_SHARDS),
        "With --engine ray: shard tasks to cut the work into (0: the split already in --out, "
        "else one per worker slot of the cluster, at least one per 50,000 items).",
    )  # fmt: skip


# ONNX export: torch's default opset for its exporters (torch.onnx's ONNX_DEFAULT_OPSET, 2.5 to
# 2.14); 17 brings LayerNormalization (timm's transformers), onnxruntime 1.18 runs up to 21
ONNX_OPSET, ONNX_MIN_OPSET, ONNX_MAX_OPSET = 20, 17, 21


@dataclass(frozen=True)
class OnnxConfig:
    opset: int = setting(
        ONNX_OPSET, integer(ONNX_MIN_OPSET, ONNX_MAX_OPSET),
        "ONNX operator set the graph is written in.",
    )  # fmt: skip
    check_images: int = setting(
        3, integer(0),
        "Random images run by torch and onnxruntime before the file is kept.", cli=False,
    )  # fmt: skip
    tolerance: float = setting(
        1e-4, number(0, 2),
        "Their vectors' least cosine must be 1 - tolerance or more.", cli=False,
    )  # fmt: skip


@dataclass(frozen=True)
class ParquetConfig:
    rows_per_shard: int = setting(
        1_000_000, integer(1), "Vectors per .npy shard (2 GB of 512-d float32)."
    )


QUANTIZATION_NAMES = ("int8", "none")  # pactl.interop.qdrant.QUANTIZATIONS
MAX_QDRANT_SHARDS = 1_024  # far past any cluster's nodes: a shard per node is the start


@dataclass(frozen=True)
class QdrantConfig:
    """`pactl export --to qdrant`: the collection's layout across a cluster, how points go in,
    and the recall its search is tuned to (pactl.interop.qdrant)."""

    collection: str = setting("pactl", text(), "The Qdrant collection's name.")
    batch_size: int = setting(
        256,
        integer(1, MAX_BATCH_SIZE),
        "Points per upsert (and per lookup of the ids already there).",
    )
    shards: int | None = setting(
        None, optional(integer(1, MAX_QDRANT_SHARDS)),
        "Shards of a new collection, spread over a distributed Qdrant's nodes (default: "
        "Qdrant's, one per node).",
    )  # fmt: skip
    replication: int = setting(
        1, integer(1, 16), "Copies of each shard on a distributed Qdrant (replication factor)."
    )
    quantization: str = setting(
        "int8", choice(*QUANTIZATION_NAMES),
        "int8: scalar-quantised vectors kept in RAM, searched first and rescored from the "
        "float vectors; none: the float vectors alone.",
    )  # fmt: skip
    on_disk: bool = setting(
        True, flag(), "Keep the float vectors on disk (memory-mapped); in RAM with --in-ram."
    )
    hnsw_m: int = setting(
        16, integer(4, 128), "Links per node of the HNSW graph built after upload."
    )
    ef_construct: int = setting(
        100, integer(4, 4_096), "Candidates the HNSW build keeps per node (Qdrant's ef_construct)."
    )
    parallel: int = setting(
        1, integer(1, 64),
        "Upload streams (processes) to a server; qdrant-client's local mode writes in one.",
    )  # fmt: skip
    target_recall: float = setting(
        0.95, number(0, 1),
        "Recall@10 against exact search that the search's hnsw_ef and oversampling are "
        "tuned to, kept in the collection's metadata (0: not tuned, searched exactly).",
    )  # fmt: skip


C = TypeVar("C", ModelConfig, TrainConfig, IndexConfig)
R = TypeVar("R")
SETTINGS = (ModelConfig, TrainConfig)  # what `pactl train` and a sweep point set


def rules(cls: type) -> dict[str, Rule]:
    """Each field's rule, by name."""
    return {f.name: f.metadata["rule"] for f in dataclasses.fields(cls)}


def declaration(cls: type, name: str) -> dict[str, Any]:
    """The declaration (setting's metadata) of the field `name` of the record `cls`."""
    return dict(cls.__dataclass_fields__[name].metadata)  # type: ignore[attr-defined]


def option_of(cls: type, name: str) -> str:
    """The option that sets the field `name` of `cls` (--field-name unless declared)."""
    return declaration(cls, name)["option"] or "--" + name.replace("_", "-")


def choices_of(cls: type, name: str) -> tuple[str, ...]:
    """The declared choices of a field of `cls` (a choice rule's names)."""
    return rules(cls)[name].names


def check_options(config: R, error: type[PactlError] = PactlError) -> R:
    """`config` when every field keeps its rule (and the fields go together), else `error`
    naming the first bad field by its option."""
    return check(config, lambda name: option_of(type(config), name), error)


MODEL_RULES = rules(ModelConfig)
TRAIN_RULES = rules(TrainConfig)
INDEX_RULES = rules(IndexConfig)


def declared(name: str) -> dict[str, Any]:
    """The declaration (setting's metadata) of a ModelConfig or TrainConfig field."""
    for cls in SETTINGS:
        for f in dataclasses.fields(cls):
            if f.name == name:
                return dict(f.metadata)
    raise KeyError(name)


def option_name(name: str) -> str:
    """The `pactl train` option that sets the field `name` (--dim for embedding_dim)."""
    try:
        option = declared(name)["option"]
    except KeyError:
        option = None
    return option or "--" + name.replace("_", "-")


def help_of(name: str) -> str:
    """A setting's help, as its option shows it."""
    return str(declared(name)["help"])


def option_fields() -> dict[str, str]:
    """Parameter name of each `pactl train` option that sets a field -> the field's name
    (`dim` -> embedding_dim, `m` -> m_per_class)."""
    return {
        option_name(f.name).removeprefix("--").replace("-", "_"): f.name
        for cls in SETTINGS
        for f in dataclasses.fields(cls)
        if f.metadata["cli"]
    }


def resume_keeps() -> set[str]:
    """The fields a resumed run keeps from its config.json (every setting but those declared
    `resume=True`)."""
    return {f.name for cls in SETTINGS for f in dataclasses.fields(cls) if not f.metadata["resume"]}


def split_settings(given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Settings by field name -> (ModelConfig's, TrainConfig's)."""
    model = {f.name for f in dataclasses.fields(ModelConfig)}
    return (
        {k: v for k, v in given.items() if k in model},
        {k: v for k, v in given.items() if k not in model},
    )


def override(config: C, **changes: Any) -> C:
    """A copy of `config` with the given fields changed; `None` values are ignored."""
    given = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(config, **given)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Rebuild a config from its dict, turning lists back into tuples, ignoring unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names
    }
    return cls(**values)


def problems(config: Any) -> list[tuple[str, str]]:
    """(field, what is wrong) for each field of `config` that breaks its rule, then for settings
    that do not go together."""
    found = []
    for name, rule in rules(type(config)).items():
        value = getattr(config, name)
        if not rule.ok(value):
            found.append((name, f"must be {rule.wants} (got {shown(value)})"))
    if found:
        return found
    if isinstance(config, ModelConfig):
        if config.resize_size is not None and config.resize_size < config.image_size:
            found.append(("resize_size", f"must be at least the image size {config.image_size}"))
        if config.embedding_dim and config.dimension not in (None, config.embedding_dim):
            found.append(("dimension", f"must equal the embedding size {config.embedding_dim}"))
        if config.bits and config.embedding_dim != config.bits:
            found.append((
                "embedding_dim",
                f"must equal the bits, {config.bits} (got {config.embedding_dim}): a network's "
                "codes are the signs of its vectors",
            ))  # fmt: skip
    elif (
        isinstance(config, TrainConfig)
        and config.sampler == "m_per_class"
        and config.batch_size % config.m_per_class
    ):
        found.append(
            ("m_per_class", f"{config.m_per_class} must divide the batch size {config.batch_size}")
        )
    return found


def check(config: R, name: Callable[[str], str], error: type[PactlError] = PactlError) -> R:
    """`config` when every field keeps its rule, else `error` naming the first bad field as
    `name(field)` (an option, or a file and key)."""
    found = problems(config)
    if found:
        field_name, wrong = found[0]
        raise error(f"{name(field_name)} {wrong}")
    return config


def read_config(cls: type[C], data: Any, where: str) -> C:
    """A config rebuilt from a file's dict and checked; `where` names the dict ("FILE:
    model_config") in the one-line error."""
    if not isinstance(data, dict):
        raise PactlError(f"{where} should be a mapping of settings, not {type(data).__name__}")
    return check(from_dict(cls, data), lambda name: f"{where}.{name}")


def weights_words(weights: str) -> str:
    """How a line names `--weights`: ImageNet weights, random weights, or the file."""
    return {"imagenet": "ImageNet weights", "none": "random weights"}.get(
        weights, f"weights {weights}"
    )
