"""What each install brings, and that it is enough: the client install (httpx and aiohttp only) runs the README's
agent against a live server, the server install alone passes `python -m stopdesk check`, each
framework extra imports its integration without the server, and the two locks hold exactly what
their requirements/*.in files need.

The slow tests build scratch venvs with pip (packages from the registry, pinned by the locks)."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import pytest
from django.conf import settings
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.run.helpers import ROOT, clean_env

REQUIREMENTS = ROOT / "requirements"
RUNTIME_INPUTS = ["client.in", "server.in"]
# crewai.in is locked apart (tests/frameworks_venvs/crewai.lock): it cannot be installed beside the server.
APART = {"crewai.in"}
EVERY_INPUT = sorted(p.name for p in REQUIREMENTS.glob("*.in"))
ALL_INPUTS = [p for p in EVERY_INPUT if p not in APART]
# What only the developer's venv may hold: none of it in the image.
NEVER_IN_THE_IMAGE = {"pytest", "playwright", "mypy", "ruff", "schemathesis", "hypothesis", "import-linter"}
FRAMEWORKS = {
    "openai-agents": "openai_agents",
    "pydantic-ai": "pydantic_ai",
    "langgraph": "langgraph",
    "claude-agent-sdk": "claude_agent_sdk",
}
FRAMEWORK_PACKAGES = {
    "openai-agents": "openai-agents",
    "pydantic-ai": "pydantic-ai-slim",
    "langgraph": "langgraph",
    "claude-agent-sdk": "claude-agent-sdk",
}


def requirements_in(*names: str) -> list[Requirement]:
    found = []
    for name in names:
        for line in (REQUIREMENTS / name).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(Requirement(line.strip()))
    return found


def read_lock(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def closure(roots: Iterable[Requirement]) -> set[str]:
    """Every distribution the roots need on this platform, read from the installed packages'
    metadata, each with the extras it was asked for."""
    seen: set[tuple[str, str]] = set()
    todo = [(r, "") for r in roots]
    names: set[str] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({**default_environment(), "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        names.add(name)
        for wanted in ["", *sorted(req.extras)]:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            try:
                requires = metadata.requires(name) or []
            except metadata.PackageNotFoundError:
                pytest.fail(f"{name} is not installed in this venv: make lock, then make venv")
            todo.extend((Requirement(r), wanted) for r in requires)
    return names


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pip_freeze(python: Path) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True).stdout
    pins = {}
    for line in out.splitlines():
        if "==" in line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
        elif " @ " in line:  # the project itself, installed from its copy
            pins[canonicalize_name(line.split(" @ ")[0])] = "local"
    return {name: v for name, v in pins.items() if name not in {"pip", "setuptools"}}


# --- the locks and the extras (no network) -----------------------------------------------------


def test_each_extra_is_one_in_file_and_the_default_is_the_client() -> None:
    dynamic = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert dynamic["dependencies"] == {"file": ["requirements/client.in"]}
    extras = {name: spec["file"] for name, spec in dynamic["optional-dependencies"].items()}
    # Every .in file but the client (the default) and dev.in (never installed by users) is an extra
    # of its own name: a new framework's file without its line in pyproject fails here.
    assert extras == {p[:-3]: [f"requirements/{p}"] for p in EVERY_INPUT if p not in ("client.in", "dev.in")}
    assert [r.name for r in requirements_in("client.in")] == ["httpx", "aiohttp"]


def test_the_runtime_lock_holds_exactly_what_client_and_server_need() -> None:
    lock = read_lock(ROOT / "requirements.lock")
    needed = closure(requirements_in(*RUNTIME_INPUTS))
    assert set(lock) == needed, (
        f"requirements.lock lacks {sorted(needed - set(lock))} and has {sorted(set(lock) - needed)} too many: make lock"
    )
    assert not NEVER_IN_THE_IMAGE & set(lock)
    frameworks = {canonicalize_name(r.name) for r in requirements_in(*(f"{extra}.in" for extra in FRAMEWORKS))}
    server = {canonicalize_name(r.name) for r in requirements_in(*RUNTIME_INPUTS)}
    assert not (frameworks - server) & set(lock)


def test_the_dev_lock_holds_everything_at_the_runtime_locks_versions() -> None:
    dev, runtime = read_lock(ROOT / "requirements-dev.lock"), read_lock(ROOT / "requirements.lock")
    stale = {n: (v, installed_version(n)) for n, v in dev.items() if installed_version(n) != v}
    assert not stale, f"this venv is not requirements-dev.lock (make venv): {stale}"
    needed = closure(requirements_in(*ALL_INPUTS))
    assert set(dev) == needed, f"lacks {sorted(needed - set(dev))}, too many {sorted(set(dev) - needed)}: make lock"
    assert {n: dev[n] for n in runtime} == runtime
    for req in requirements_in(*ALL_INPUTS):
        assert req.specifier.contains(dev[canonicalize_name(req.name)], prereleases=True), str(req)


def test_the_image_installs_the_runtime_lock_alone() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = re.findall(r"pip install[^\n]*", dockerfile)
    assert installs == ["pip install --no-cache-dir -r requirements.lock"]


# --- real installs in scratch venvs --------------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree as a clone has it, without this checkout's venv and builds: pip builds in
    the source folder, which must not be the one the suite runs from."""
    copy = tmp_path_factory.mktemp("clone") / "stopdesk"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "node_modules", "git-venv")
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, copy / name)
    for name in ("requirements", "stopdesk", "reconcile", "stopdrill"):
        shutil.copytree(ROOT / name, copy / name, ignore=skip)
    return copy


def make_venv(where: Path, *pip_args: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pip_args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return python


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_the_server_install_alone_passes_check(source: Path, tmp_path: Path) -> None:
    """`pip install "stopdesk[server]"` from a clone, nothing else: the configuration check of the
    production entry point runs, and the install is the image's lock, package for package."""
    python = make_venv(tmp_path / "venv", "-c", str(ROOT / "requirements.lock"), f"{source}[server]")
    installed = pip_freeze(python)
    assert installed.pop("stopdesk") == "local"
    assert installed == read_lock(ROOT / "requirements.lock")
    env = clean_env(
        tmp_path,
        STOPDESK_ENV="production",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="stopdesk.example.com",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres",
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
    )
    env.pop("PYTHONPATH", None)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    # From a folder of its own, so the import finds the installed package, not this checkout.
    check = subprocess.run(
        [python, "-m", "stopdesk", "check"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stderr
    assert "configuration ok; the database and the broker answer" in check.stdout
    # What `web`, `watch`, `mcp-gateway`, `worker` and `beat` load before they serve: the WSGI
    # handler with its middleware, the two ASGI apps, the servers and the Celery app with its tasks.
    load = (
        "import django; django.setup(); import gunicorn, uvicorn, stopdesk;"
        "from stopdesk.wsgi import application; application.load_middleware();"
        "import stopdesk.asgi, stopdesk.gateway.server, stopdesk.celery, stopdesk.tasks, reconcile.tasks;"
        # and the pages it serves: their templates and static files come with the package
        "from django.template.loader import get_template; get_template('tasks/detail.html');"
        "from django.contrib.staticfiles import finders;"
        "assert finders.find('stopdesk/app.css') and finders.find('vendor/htmx-2.0.11/htmx.min.js');"
        "print(stopdesk.__file__)"
    )
    loaded = subprocess.run(
        [python, "-c", load], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.startswith(str(tmp_path / "venv")), loaded.stdout


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_client_install_brings_httpx_and_aiohttp_alone_and_runs_the_readme_agent(
    source: Path, tmp_path: Path, live_server
) -> None:
    from stopdesk.services.runtimes import runtime_create
    from tests.api.test_readme import _example

    python = make_venv(tmp_path / "venv", "-c", str(ROOT / "requirements.lock"), str(source))
    installed = pip_freeze(python)
    assert installed.pop("stopdesk") == "local"
    assert set(installed) == closure(requirements_in("client.in")), installed
    assert not {"django", "pydantic", "celery", "openai", "mcp"} & set(installed)

    # The server's entry point says in one line what to install, instead of a traceback.
    server = subprocess.run(
        [python, "-m", "stopdesk", "check"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert server.returncode == 1
    assert (
        server.stderr.strip()
        == 'stopdesk: the server is not installed here (only the client is): pip install "stopdesk[server]"'
    )
    # So does the MCP gateway's stdio shim, which the client install puts on the PATH too.
    shim = subprocess.run(
        [python.parent / "stopdesk-mcp", "--", "true"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert shim.returncode == 1 and shim.stdout == ""
    assert shim.stderr.strip() == (
        'stopdesk-mcp: the MCP gateway is part of the server, not installed here: pip install "stopdesk[server]"'
    )

    token = runtime_create(name="client-install", actor="test")[1]
    env = {k: v for k, v in clean_env(tmp_path).items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    env.update(STOPDESK_URL=live_server.url, STOPDESK_TOKEN=token, STEP_SECONDS="0.03")
    agent = subprocess.run(
        [python, str(_example(tmp_path))], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert agent.returncode == 0, agent.stderr
    assert agent.stdout.strip().splitlines()[-1] == (
        "Finished. One email sent; it cannot be recalled. Five drafts completed."
    )


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(FRAMEWORKS))
def test_a_framework_extra_alone_imports_its_integration_without_the_server(
    source: Path, tmp_path: Path, extra: str
) -> None:
    """One venv per extra, so one extra's packages cannot hide what another's file forgot."""
    python = make_venv(tmp_path / "venv", "-c", str(ROOT / "requirements-dev.lock"), f"{source}[{extra}]")
    installed = pip_freeze(python)
    assert not {"django", "celery", "psycopg", "gunicorn", "pytest"} & set(installed)
    assert FRAMEWORK_PACKAGES[extra] in installed
    assert not {FRAMEWORK_PACKAGES[other] for other in FRAMEWORKS if other != extra} & set(installed)
    env = {k: v for k, v in clean_env(tmp_path).items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    done = subprocess.run(
        [python, "-c", f"import stopdesk.agent.frameworks.{FRAMEWORKS[extra]}, stopdesk.client"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
