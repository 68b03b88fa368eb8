"""The package's shape, held as tests (`make lint` runs them too): rooms of a bounded size, no
module importing the package's front door, a standard-library client, one declaration per
setting with the CLI and the registries in step, and one settling of a recipe for `pactl
train` and a sweep point."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import subprocess
import sys
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

import pactl
from pactl.config import TRAIN_RULES, ModelConfig, TrainConfig, option_fields, resume_keeps

PACKAGE = Path(pactl.__file__).parent
MAX_MODULE_LINES = 600
MAX_BODY_LINES = 60


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's body, its docstring left out (for a command, the docstring is its help, as
    its signature is its options)."""
    body = node.body
    first = body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    start = body[1].lineno if docstring and len(body) > 1 else first.lineno
    return (node.end_lineno or start) - start + 1


def test_no_module_or_function_outgrows_a_room() -> None:
    long_modules = {
        str(p.relative_to(PACKAGE)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long_modules == {}
    long_functions = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            functions = ast.FunctionDef | ast.AsyncFunctionDef
            if isinstance(node, functions) and (n := body_lines(node)) > MAX_BODY_LINES:
                long_functions[f"{path.relative_to(PACKAGE)}:{node.name}"] = n
    assert long_functions == {}


def test_the_body_counter_counts_what_it_says() -> None:
    """A 61-line body is over the limit, a docstring is not counted."""
    code = 'def f():\n    """doc\n    more"""\n' + "    x = 1\n" * 61
    node = ast.parse(code).body[0]
    assert isinstance(node, ast.FunctionDef) and body_lines(node) == 61


def test_nothing_inside_pactl_imports_the_package_front_door() -> None:
    """pactl/__init__.py hands the API on lazily; a module that imports it for a name (its
    __version__, say) ties every layer to the API's (pactl.version is the leaf for that)."""
    submodules = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()
    }
    found = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name == "pactl" for a in node.names):
                found.append(str(path.relative_to(PACKAGE)))
            if isinstance(node, ast.ImportFrom) and node.module == "pactl" and not node.level:
                names = {a.name for a in node.names} - submodules
                if names:
                    found.append(f"{path.relative_to(PACKAGE)}: {sorted(names)}")
    assert found == []


def test_the_service_client_loads_only_the_standard_library_and_the_results() -> None:
    """`pactl query --server` needs none of numpy, FAISS or torch: a fresh interpreter that
    imports the client loads nothing else of pactl than these standard-library-only leaves."""
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import pactl.serve.client\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    pactl_modules = {m for m in loaded if m.split(".")[0] == "pactl"}
    assert pactl_modules <= {
        "pactl",
        "pactl.version",
        "pactl.serve",
        "pactl.serve.client",
        "pactl.store",  # the wing's docstring only
        "pactl.results",
        "pactl.errors",
        "pactl.store.regular_files",
    }
    outside = {
        m.split(".")[0] for m in loaded if m.split(".")[0] not in sys.stdlib_module_names
    } - {"pactl", "__editable___pactl_0_1_0_finder"}
    assert outside == set(), outside


def test_the_api_names_are_what_pactl_hands_on() -> None:
    import pactl.api

    assert list(pactl._API) == list(pactl.api.__all__)
    for name in pactl.api.__all__:
        assert getattr(pactl, name) is getattr(pactl.api, name)


def test_every_choice_list_is_its_registry() -> None:
    """The choices a setting declares are the names of the registry that implements them, and
    the CLI offers exactly those."""
    from pactl.cli import options
    from pactl.codes.learned import CODE_PROXIES
    from pactl.losses import LOSSES
    from pactl.model import POOLINGS
    from pactl.runtime import AMP
    from pactl.training.samplers import SAMPLERS
    from pactl.transforms import AUGMENTS

    pooling = dict(ModelConfig.__dataclass_fields__)["pooling"].metadata["rule"].names
    registries = {
        "loss": (tuple(LOSSES), options.Loss),
        "code_proxies": (tuple(CODE_PROXIES), options.CodeProxies),
        "augment": (tuple(AUGMENTS), options.Augment),
        "sampler": (tuple(SAMPLERS), options.Sampler),
        "amp": (tuple(AMP), options.Amp),
        "pooling": (tuple(POOLINGS), options.Pooling),
    }
    for name, (registry, enum) in registries.items():
        declared = pooling if name == "pooling" else TRAIN_RULES[name].names
        assert declared == registry, name
        assert tuple(member.value for member in enum) == registry, name


TRAIN_OPTIONS_NOT_SETTINGS = {
    "ctx", "source", "preset", "seeds", "name", "resume", "overwrite", "print_config", "quiet",
}  # fmt: skip


def test_every_train_option_is_a_declared_setting_or_a_run_option() -> None:
    """The train command's parameters and the declarations agree: a parameter sets the field
    its declaration names (--dim sets embedding_dim), every field declared with an option has
    one, and --resume refuses every setting but those declared resumable."""
    from pactl.cli.train import RUN_OPTIONS, train

    params = set(inspect.signature(train).parameters)
    fields = option_fields()
    assert params - TRAIN_OPTIONS_NOT_SETTINGS == set(fields)
    assert fields["dim"] == "embedding_dim" and fields["m"] == "m_per_class"
    every = {f.name for c in (ModelConfig, TrainConfig) for f in dataclasses.fields(c)}
    assert every - resume_keeps() == {"epochs", "device", "workers", "precision"}
    assert set(RUN_OPTIONS) <= TRAIN_OPTIONS_NOT_SETTINGS


@pytest.mark.parametrize(
    ("settings", "options"),
    [
        ({"image_size": 32}, ["--image-size", "32"]),  # the case the two paths once disagreed on
        ({"image_size": 32, "resize_size": 40}, ["--image-size", "32", "--resize-size", "40"]),
        ({"embedding_dim": 32, "val_classes": 0.2}, ["--dim", "32", "--val-classes", "0.2"]),
        ({"loss": "proxy_nca", "m_per_class": 8, "sampler": "m_per_class"},
         ["--loss", "proxy_nca", "--m", "8", "--sampler", "m_per_class"]),
    ],
)  # fmt: skip
def test_train_and_a_sweep_point_settle_the_same_settings_alike(
    settings: dict[str, object],
    options: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from conftest import run_cli

    from pactl.recipe import resolve_train_config
    from pactl.research.sweep import SweepConfig, sweep_point_configs

    config = SweepConfig(
        source="digits",
        params=tuple((k, (v,)) for k, v in settings.items()),
        fixed=(("device", "cpu"),),
    )
    model, train = sweep_point_configs(config, "cpu", dict(settings), 0)
    train = resolve_train_config(model, train, False)
    code, out, err = run_cli(
        ["train", "digits", "--device", "cpu", *options, "--print-config"], monkeypatch, capsys
    )
    assert code == 0, err
    shown = json.loads(out)
    assert shown["model"] == json.loads(json.dumps(dataclasses.asdict(model)))
    assert shown["train"] == json.loads(json.dumps(dataclasses.asdict(train)))
    if "image_size" in settings and "resize_size" not in settings:  # digits' ratio is 24/24
        assert model.resize_size == settings["image_size"]


# Fields an option sets in other units, or as text the verb parses: the option exists, its
# range and default are the verb's to convert.
CONVERTED = {"max_upload_bytes", "params", "fixed", "seeds"}
# (verb, field): why the option's range is not the rule's
RANGE_NOT_THE_RULE = {
    ("index", "bits"): "0 (the dimension) is the option left out; the vectors bound the most",
    ("eval", "precision"): "0 passes the range and is refused by the rule, in its own words",
}


def record_options() -> list[tuple[str, type]]:
    """Each config record (but train's, tested above) with the verb whose options set it."""
    from pactl.calibrate import CalibrationConfig
    from pactl.config import (
        EmbedConfig,
        EngineConfig,
        IndexConfig,
        OnnxConfig,
        ParquetConfig,
        QdrantConfig,
    )
    from pactl.index.grouping import DedupConfig
    from pactl.research.plot import PlotConfig
    from pactl.research.sweep import SweepConfig
    from pactl.serve.config import ServeConfig
    from pactl.verbs.audit import AuditConfig

    return [
        ("embed", EmbedConfig), ("index", IndexConfig), ("export", OnnxConfig),
        ("export", ParquetConfig), ("export", QdrantConfig), ("audit", AuditConfig),
        ("serve", ServeConfig), ("sweep", SweepConfig), ("plot", PlotConfig),
        ("eval", CalibrationConfig), ("dedup", DedupConfig), ("embed", EngineConfig),
        ("index", EngineConfig),
    ]  # fmt: skip


def range_disagreements(low: float | None, high: float | None, whole: bool, rule: Any) -> list[str]:
    """The ends of an option's range that the field's rule does not draw alike: each end
    accepted by both, the next value past it refused by both (an open end: the rule takes a
    very large value too)."""
    wrong = []
    for end, outward in ((low, -1), (high, 1)):
        if end is None:
            if not rule.ok(outward * (10**15 if whole else 1e15)):
                wrong.append(f"unbounded {'above' if outward > 0 else 'below'}")
            continue
        past = end + outward if whole else math.nextafter(end, outward * math.inf)
        if not rule.ok(end) or rule.ok(past):
            wrong.append(f"end {end}")
    return wrong


def option_kind(param: Any) -> tuple[tuple[str, ...], bool]:
    """An option's choices (its Enum's values) and whether it takes integers."""
    annotation = param.type_descriptor.annotation
    kinds = typing.get_args(annotation) or (annotation,)
    enums = [k for k in kinds if isinstance(k, type) and issubclass(k, Enum)]
    return tuple(m.value for m in enums[0]) if enums else (), int in kinds


def test_every_record_and_its_verbs_options_agree() -> None:
    """Each field an option sets (declared without cli=False) has that option, and the option
    offers the declared choices, starts at the declared default and keeps the rule's range:
    an option and its field that drift apart (a choice added to one, a limit moved) fail
    here."""
    import typer.main

    from pactl.cli import app
    from pactl.config import declaration, option_of, rules

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    problems = []
    for verb, cls in record_options():
        for name, rule in rules(cls).items():
            if not declaration(cls, name)["cli"]:
                continue
            option = option_of(cls, name)
            found = [p for p in commands[verb].params if option in p.opts or p.name == name]
            if not found:
                problems.append(f"{cls.__name__}.{name}: {verb} has no {option}")
                continue
            param, where = found[0], f"{cls.__name__}.{name} ({verb} {option})"
            offered, whole = option_kind(param)
            if offered != rule.names:
                problems.append(f"{where}: offers {offered}, declared {rule.names}")
            if name in CONVERTED:
                continue
            default = getattr(param.default, "value", param.default)
            default = not default if option.startswith("--no-") else default
            field = cls.__dataclass_fields__[name]
            given = default is not None and field.default is not dataclasses.MISSING
            if given and default != field.default:
                problems.append(f"{where}: default {default!r}, declared {field.default!r}")
            if (verb, name) not in RANGE_NOT_THE_RULE and (param.min, param.max) != (None, None):
                problems += [
                    f"{where}: {w}" for w in range_disagreements(param.min, param.max, whole, rule)
                ]
    assert problems == []


def test_the_record_agreement_test_sees_a_drift() -> None:
    """The checks above fail where an option and its rule part: a limit moved by one, an open
    end the rule closes, an end the rule leaves out."""
    from pactl.rules import integer, number

    assert range_disagreements(1, 10, True, integer(1, 10)) == []
    assert range_disagreements(1, 10, True, integer(1, 11)) == ["end 10"]
    assert range_disagreements(0, None, True, integer(1)) == ["end 0"]
    assert range_disagreements(1, None, True, integer(1, 10**6)) == ["unbounded above"]
    assert range_disagreements(0.0, 1.0, False, number(0, 1, above=True)) == ["end 0.0"]
    assert range_disagreements(0.0, 1.0, False, number(0, 1)) == []


def test_the_index_registries_are_the_declared_choices() -> None:
    """IndexConfig's choices are those its builders implement (and the CLI offers, above)."""
    from pactl.codes.rotation import ROTATION_CHOICES
    from pactl.config import INDEX_RULES
    from pactl.index.gpus import FAISS_DEVICES
    from pactl.index.ondisk import ON_DISK_CHOICES

    assert INDEX_RULES["on_disk"].names == ON_DISK_CHOICES
    assert INDEX_RULES["faiss_device"].names == FAISS_DEVICES
    assert INDEX_RULES["rotation"].names == ROTATION_CHOICES


def declarations(name: str, literal: str | None) -> list[str]:
    """Where pactl/ assigns `name` at a module's top, or writes the string `literal`."""
    found = []
    for path in modules():
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            named = any(isinstance(t, ast.Name) and t.id == name for t in targets)
            if named or any(
                isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value == literal
                for n in ast.walk(node)
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


@pytest.mark.parametrize(
    ("name", "literal", "home"),
    [
        ("MAX_DIMENSION", None, "rules.py"),
        ("VECTORS_FORMAT", "pactl.vectors", "store/vectors_folder.py"),
    ],
)
def test_the_vectors_folder_format_is_declared_once(
    name: str, literal: str | None, home: str
) -> None:
    """The vectors folder's format name and its widest vector are declared in one place
    (pactl.store.vectors_folder; MAX_DIMENSION in pactl.rules, the leaf under it), so a
    reader and a writer cannot come to disagree on them."""
    found = declarations(name, literal)
    assert len(found) == 1 and found[0].startswith(f"{home}:"), found
