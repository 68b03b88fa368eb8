"""Every dotted `pactl.x.y` in a docstring or a comment of pactl/ names something that exists: a
module, and a name defined in it (a function, a class, a constant, a dataclass field, a method).
A name that moved leaves its old spelling behind in prose; this finds it.

A dotted word that pactl writes into a file (the format `pactl.run`, the ONNX metadata key
`pactl.fingerprint`) is a format's spelling, not a reference: it is exempt where the code holds
it as a string value."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pactl

PACKAGE = Path(pactl.__file__).parent
DOTTED = re.compile(r"(?<![\w./-])pactl(?:\.[A-Za-z_]\w*)+")


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of each comment and each docstring (a bare string statement: a module's,
    class's or function's docstring, or an attribute's)."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.append((node.lineno, node.value.value))
    return found


def line_of(start: int, text: str, at: int) -> int:
    """The file's line of `text[at]`, `text` starting on line `start`."""
    return start + text.count("\n", 0, at)


def format_words() -> set[str]:
    """The `pactl.`-dotted strings the code holds as values (format names, metadata keys)."""
    words: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        for node in ast.walk(tree):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and id(node) not in docstrings and DOTTED.fullmatch(value):
                words.add(value)
    return words


def module_file(module: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


# What a name is bound to: a class (its body is looked into), the dotted name it was imported
# from (followed), or anything else (None: a function, a constant, a field, a lazy name).
Binding = ast.ClassDef | str | None


@cache
def module_names(module: str) -> dict[str, Binding]:
    """The names a module's top level binds. A module with a __getattr__ hands on names lazily
    from tables of strings (pactl's _API, embed's _HOME): those strings count as its names."""
    path = module_file(module)
    assert path is not None
    tree = ast.parse(path.read_text())
    names = body_names(tree.body)
    if "__getattr__" in names:
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                strings = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]
                names.update({s: None for s in strings if isinstance(s, str) and s not in names})
    return names


def body_names(body: list[ast.stmt]) -> dict[str, Binding]:
    names: dict[str, Binding] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update({n.id: None for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            names.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, guarded definitions
            names.update(body_names(node.body))
    return names


def resolves(dotted: str, depth: int = 0) -> bool:
    """Resolved as `import` would, read from the source (nothing is imported, so a module that
    needs torch costs nothing): the longest prefix that is a module of pactl, then each further
    part bound where the previous one points, following re-exports to where they are defined."""
    parts = dotted.split(".")
    cut = next((c for c in range(len(parts), 0, -1) if module_file(".".join(parts[:c]))), 0)
    if cut == 0 or depth > 10:
        return False
    module = ".".join(parts[:cut])
    names, rest = module_names(module), parts[cut:]
    for i, part in enumerate(rest):
        if part not in names:
            return False
        binding = names[part]
        if isinstance(binding, str):
            if not binding.startswith("pactl."):
                return True  # imported from outside pactl: not pactl's to check
            return resolves(".".join([binding, *rest[i + 1 :]]), depth + 1)
        if i + 1 < len(rest):
            if not isinstance(binding, ast.ClassDef):
                return False
            names = class_names(binding, module, depth)
    return True


def class_names(node: ast.ClassDef, module: str, depth: int) -> dict[str, Binding]:
    """A class's own names, its dataclass fields among them, and those of its bases in pactl."""
    names = body_names(node.body)
    for base in node.bases:
        if isinstance(base, ast.Name):
            bound = module_names(module).get(base.id)
            if isinstance(bound, ast.ClassDef):
                names = {**class_names(bound, module, depth + 1), **names}
            elif isinstance(bound, str) and bound.startswith("pactl."):
                owner, _, name = bound.rpartition(".")
                found = module_names(owner).get(name) if module_file(owner) else None
                if isinstance(found, ast.ClassDef):
                    names = {**class_names(found, owner, depth + 1), **names}
    return names


def stale_references() -> list[str]:
    exempt = format_words()
    stale = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in prose(path.read_text()):
            for match in DOTTED.finditer(text):
                name = match.group()
                if name in exempt or resolves(name):
                    continue
                where = f"{path.relative_to(PACKAGE.parent)}:{line_of(line, text, match.start())}"
                stale.append(f"{where}: {name}")
    return stale


def test_every_dotted_pactl_name_in_a_docstring_or_comment_resolves() -> None:
    assert stale_references() == []


def test_the_resolver_tells_a_moved_name_from_a_present_one() -> None:
    """Names that exist, at each depth and kind, resolve; names that moved or never were do not."""
    present = [
        "pactl.index",
        "pactl.index.tune.ann_recall",  # a function
        "pactl.runs.RUN_FORMAT",  # a constant
        "pactl.config.TrainConfig.epochs",  # a dataclass field (no class attribute)
        "pactl.index.exact_neighbours",  # a name a package re-exports
        "pactl.train",  # pactl's lazy __getattr__
    ]
    absent = [
        "pactl.parallel",  # moved to pactl.audit.processes
        "pactl.index.build.recall_at_k",  # became pactl.index.tune.ann_recall
        "pactl.config.TrainConfig.no_such_field",
        "pactl.runs.RUN_FORMAT.upper.x",
    ]
    for name in present:
        assert resolves(name), name
    for name in absent:
        assert not resolves(name), name


def test_prose_reads_comments_and_docstrings_but_not_code() -> None:
    source = (
        '"""Module: see pactl.a.b."""\n'
        "X = 'pactl.format'  # see pactl.c.d\n"
        "def f():\n"
        '    """pactl.e.f"""\n'
    )
    texts = " ".join(text for _, text in prose(source))
    assert sorted(DOTTED.findall(texts)) == ["pactl.a.b", "pactl.c.d", "pactl.e.f"]


def test_the_tests_map_names_every_module_and_every_test_file() -> None:
    """tests/README.md has a row for each module of pactl and no row for a module that is gone,
    and names each test file there is and none that is not."""
    readme = Path(__file__).with_name("README.md").read_text()
    rows = dict(re.findall(r"^\| (pactl[\w.]*) \| (.*) \|$", readme, re.MULTILINE))
    found = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in PACKAGE.rglob("*.py")
    }
    assert sorted(found - set(rows)) == [], "modules without a row"
    assert sorted(set(rows) - found) == [], "rows for modules that are gone"
    named = set(re.findall(r"\btest_\w+\.py\b", readme))
    files = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    assert sorted(named - files) == [], "test files named that do not exist"
    assert sorted(files - named) == [], "test files the map does not name"
