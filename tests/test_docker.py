"""The Dockerfile, checked without a Docker engine: hadolint's rules, and the layout the docs
promise (dependencies before code, a non-root user, the package installed as the Makefile does).
tools/docker_check.sh builds and runs the image where podman or docker is installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pactl.datasets.catalog import downloads_folder
from pactl.store.home import datasets_dir
from pactl.verbs.index import default_bundle_dir
from pactl.verbs.query import find_bundle

ROOT = Path(__file__).resolve().parent.parent


def stages() -> dict[str, list[str]]:
    """Instructions per build stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM \S+ AS (\w+)", line)
        if match:
            current = match.group(1)
            out[current] = []
        if current:  # the ARGs before the first FROM are build_args()
            out[current].append(line)
    return out


def test_hadolint_finds_nothing() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(binary).exists():
        pytest.skip("hadolint is not installed (it comes with the test extra)")
    done = subprocess.run(
        [binary, "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("stage", ["cpu", "cuda"])
def test_each_image_installs_dependencies_before_the_code_and_runs_as_a_user(stage: str) -> None:
    steps = stages()[stage]
    copy_code = next(i for i, s in enumerate(steps) if s.startswith("COPY pactl"))
    dependencies = re.compile(r"pip install (\.|\"\.\[([a-z,]+)\]\")")  # . or ".[extras]"
    installs = [i for i, s in enumerate(steps) if dependencies.search(s)]
    assert installs and installs[0] < copy_code  # dependencies: a layer the code does not touch
    match = dependencies.search(steps[installs[0]])
    assert match is not None and "serve" in (match.group(2) or "").split(",")  # `serve` works
    assert "EXPOSE 8000" in steps  # the port serve listens on
    after = " ".join(steps[copy_code:])
    assert "pip install --no-deps ." in after  # only pactl itself after the code is copied
    user = next(s for s in steps if s.startswith("USER "))
    assert user.split()[1].split(":")[0] not in ("0", "root")
    assert steps.index(user) < next(i for i, s in enumerate(steps) if s.startswith("ENTRYPOINT"))
    assert 'ENTRYPOINT ["pactl"]' in steps


def test_the_cuda_image_frees_uid_1000_before_taking_it() -> None:
    """PyTorch's images are Ubuntu 24.04, which holds a user `ubuntu` with uid 1000: a plain
    useradd --uid 1000 fails the build."""
    run = next(s for s in stages()["cuda"] if "useradd" in s)
    assert "--uid 1000" in run and 'userdel --remove "$(id -nu 1000)"' in run
    assert run.index("userdel") < run.index("useradd")


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_code_fences_close_on_a_line_of_their_own(doc: str) -> None:
    """A closing ``` with text after it is no closing fence: the rest of the page, headings
    included, renders as code (README's tour of the verbs did)."""
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```"):
            if inside:
                assert line.strip() == "```", f"{doc}:{number}: {line[:60]}"
            inside = not inside
    assert not inside, f"{doc}: a code fence is never closed"


def build_args() -> dict[str, str]:
    """The defaults of the ARGs declared before the first FROM."""
    head = (ROOT / "Dockerfile").read_text().split("\nFROM ", 1)[0]
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", head, flags=re.M))


def env(stage: str) -> dict[str, str]:
    line = next(s for s in stages()[stage] if s.startswith("ENV "))
    return dict(pair.split("=", 1) for pair in shlex.split(line[len("ENV ") :]))


@pytest.mark.parametrize("stage", ["cpu", "cuda"])
def test_the_dependency_layer_reads_pyproject_alone(stage: str) -> None:
    """pyproject's `readme` is README.md: copied before the install, a docs edit reinstalled
    torch. The dependency layer makes a placeholder instead, and README.md comes with the code."""
    steps = stages()[stage]
    dependencies = next(i for i, s in enumerate(steps) if re.search(r'pip install "\.\[', s))
    early = [s for s in steps[:dependencies] if s.startswith(("COPY", "ADD"))]
    assert early == ["COPY pyproject.toml ./"]
    readme = re.search(r'^readme = "(.+)"', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert readme is not None
    install = steps[dependencies]
    assert install.index(f"touch {readme.group(1)}") < install.index('pip install ".[')
    late = " ".join(steps[dependencies:])
    assert f"COPY {readme.group(1)} ./" in late and "COPY pactl ./pactl" in late


def test_every_base_image_names_its_registry() -> None:
    """podman resolves no short name (python:3.11-slim) without a registries.conf listing one."""
    args = build_args()
    names = [s.split()[1] for steps in stages().values() for s in steps if s.startswith("FROM ")]
    assert len(names) == 2
    for name in names:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], name)
        host = resolved.split("/", 1)[0]
        assert "/" in resolved and ("." in host or ":" in host), resolved


@pytest.mark.parametrize("stage", ["cpu", "cuda"])
def test_the_cache_folders_other_uids_add_to_are_made_open(
    stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder one uid makes under the /cache volume is mode 755: the next uid's download
    failed. Those that pactl and its libraries add entries to are made in the image, mode 1777."""
    variables = env(stage)
    monkeypatch.setenv("PACTL_HOME", variables["PACTL_HOME"])
    wanted = {
        datasets_dir(),  # a dataset's folder
        downloads_folder("any").parent,  # its archives while they download
        Path(variables["TORCH_HOME"]) / "hub" / "checkpoints",  # torch.hub.get_dir() + weights
        # huggingface_hub's HF_HUB_CACHE (timm's weights); HF_HOME defaults to this one
        Path(variables.get("HF_HOME", variables["XDG_CACHE_HOME"] + "/huggingface")) / "hub",
        Path(variables["MPLCONFIGDIR"]),
    }
    run = next(s for s in stages()[stage] if "useradd" in s)
    made = {Path(p) for m in re.finditer(r"mkdir -p ((?:/\S+ *)+)", run) for p in m[1].split()}
    for folder in wanted:
        assert folder.is_relative_to("/cache")
        assert any(m == folder or m.is_relative_to(folder) for m in made), folder
    assert run.index("chmod -R 1777 /cache") > run.rindex("mkdir -p /cache")  # after every one


def docker_commands() -> list[tuple[str, str]]:
    """Every `docker run` of the README, docs/ and the Dockerfile's comments, lines joined."""
    found = []
    sources = [ROOT / "README.md", ROOT / "Dockerfile", *sorted((ROOT / "docs").glob("*.md"))]
    for path in sources:
        text = path.read_text(encoding="utf-8")
        if path.name == "Dockerfile":
            text = "\n".join(line.lstrip("# ") for line in text.splitlines())
        for command in re.sub(r"\\\n\s*", " ", text).splitlines():
            if "docker run" in command and "`" not in command:
                found.append((path.name, command[command.index("docker run") :]))
    return found


def test_docs_run_the_images_as_the_user_whose_folder_is_mounted() -> None:
    """uid 1000 cannot write a host folder it does not own: every example mounting one as /work
    runs as the caller."""
    commands = [c for c in docker_commands() if re.search(r"-v \S+:/work\"?(\s|$)", c[1])]
    assert len(commands) >= 5
    for source, command in commands:
        assert '--user "$(id -u):$(id -g)"' in command, f"{source}: {command}"


def test_docs_serve_the_bundle_pactl_index_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve /work/index` named a folder `pactl index` writes only for a vectors folder: the
    examples name no BUNDLE, and serve's default finds what index wrote by default."""
    served = [(s, c) for s, c in docker_commands() if " serve" in c]
    assert len(served) >= 3
    for source, command in served:
        words = shlex.split(command[command.index(" serve ") :])[1:]
        assert not words or words[0].startswith("-"), f"{source}: {command}"
    monkeypatch.chdir(tmp_path)
    run = Path("runs") / "check"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    bundle = default_bundle_dir(run / "best.pt")  # where `pactl index` puts a run's bundle
    bundle.mkdir()
    (bundle / "meta.json").write_text("{}")
    assert bundle == run / "index" and find_bundle(Path("runs")) == bundle


def test_the_image_check_passes_where_no_engine_is_installed(tmp_path: Path) -> None:
    """tools/docker_check.sh builds nothing, and says so, on a machine without podman or docker."""
    bash = shutil.which("bash")
    assert bash is not None
    (tmp_path / "dirname").symlink_to(shutil.which("dirname") or "/usr/bin/dirname")
    done = subprocess.run(
        [bash, str(ROOT / "tools" / "docker_check.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},  # holds neither podman nor docker
        timeout=10,
    )
    assert done.returncode == 0, done.stderr
    assert "neither podman nor a running docker engine" in done.stdout
