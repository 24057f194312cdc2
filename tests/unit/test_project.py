"""Structural promises: extras split the tiers, the web tier never loads torch, README lists every setting."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "onnxruntime", "piper")


def _extras() -> dict[str, list[str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["project"]["optional-dependencies"]  # type: ignore[no-any-return]


def test_the_web_extra_pulls_no_torch_or_onnxruntime() -> None:
    names = [re.split(r"[<>=\[ ;]", dep, maxsplit=1)[0].lower() for dep in _extras()["web"]]
    assert not [n for n in names if n.startswith(HEAVY)], names


def test_the_extras_of_the_design_exist_and_analysis_pins_torch() -> None:
    extras = _extras()
    assert {"web", "worker", "analysis", "gpu", "dev", "bench"} <= set(extras)
    assert "torch==2.13.0" in extras["analysis"]


def _lock() -> dict[str, str]:
    """deploy/requirements.lock's pins: normalised name -> version."""
    pins: dict[str, str] = {}
    for line in (ROOT / "deploy" / "requirements.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_the_lock_pins_every_requirement_of_every_extra() -> None:
    """`make lock` was run after pyproject.toml last changed: each requirement has a pin it accepts."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = _lock()
    wanted = [Requirement(r) for r in data["project"]["dependencies"]]
    wanted += [Requirement(r) for deps in _extras().values() for r in deps]
    unmet = []
    for req in wanted:
        name = canonicalize_name(req.name)
        if name == "tts-service":
            continue
        if name not in pins or not req.specifier.contains(pins[name], prereleases=True):
            unmet.append(f"{req} (lock: {pins.get(name)})")
    assert not unmet, f"run `make lock`: {unmet}"


def test_the_lock_pins_the_cpu_torch_and_no_cuda_libraries() -> None:
    """A resolver that ignored pip's configuration would pin PyPI's CUDA torch and its nvidia-* wheels."""
    pins = _lock()
    assert pins["torch"].startswith("2.13.0")
    cuda = [n for n in pins if n.startswith(("nvidia-cu", "nvidia-nccl", "nvidia-nv", "triton"))]
    assert not cuda, cuda


def test_bootstrap_installs_from_the_lock() -> None:
    """The venv gets the lock's versions, and the project itself without resolving again."""
    script = (ROOT / "deploy" / "bootstrap.sh").read_text()
    assert re.search(r"^LOCK=deploy/requirements\.lock$", script, re.MULTILINE)
    installs = re.findall(r"pip install ([^\n]*)", script)
    # Packages whose declared extras the service leaves out (voxcpm) come --no-deps from their own lock.
    assert re.search(r"^NODEPS=deploy/requirements-nodeps\.lock$", script, re.MULTILINE)
    assert installs == [
        '-q -r "$LOCK"',
        '-q --no-deps -r "$NODEPS"',
        "-q --no-deps --no-build-isolation -e .",
    ], installs


def test_the_web_tier_imports_no_torch_or_onnxruntime() -> None:
    code = (
        "import sys, django; django.setup();"
        "import webapp.urls, webapp.speech.services, webapp.speech.api.views, webapp.health, webapp.wsgi;"
        "from django.test import Client;"
        "Client().get('/api/v1/schema');"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnxruntime', 'piper'));"
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _setting_names() -> set[str]:
    names: set[str] = set()
    # The settings read the paths of their files and secrets through webapp/provisioning.py.
    settings_src = (ROOT / "webapp" / "settings.py").read_text() + (
        ROOT / "webapp" / "provisioning.py"
    ).read_text()
    names |= set(
        re.findall(r'env_(?:str|int|float|bool|list|map|origin|networks)\(\s*"([A-Z0-9_]+)"', settings_src)
    )
    names |= set(re.findall(r'os\.environ\.get\("([A-Z0-9_]+)"', settings_src))
    for path in (ROOT / "deploy").glob("*.py"):
        names |= set(
            re.findall(
                r'(?:environ\.get|env_(?:str|int|float|bool|list|map)|env\.get)\(\s*"([A-Z0-9_]+)"',
                path.read_text(),
            )
        )
    from deploy.nginx import DEFAULTS

    names |= {f"TTS_NGINX_{name}" for name in DEFAULTS}
    # Test-only knobs are documented in tests/, not in the user's table.
    return {n for n in names if not n.startswith(("TTS_TEST_", "TTS_FAULT_"))}


def test_the_readme_settings_table_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- settings-table", 1)[1]
    documented = set(re.findall(r"^\| `([A-Z0-9_]+)`", table, re.M))
    missing = sorted(_setting_names() - documented)
    assert not missing, f"README settings table lacks: {missing}"


def test_the_readme_opens_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```", 2)[1]
    assert "make run" in first_block and "make test" in first_block
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_the_repository_stands_alone() -> None:
    """Docs and code explain the project in their own words; nothing points at files outside the repo."""
    tracked = subprocess.run(
        ["git", "ls-files", "webapp", "synth", "deploy", "tests", "docs", "README.md", "nginx"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    outside = re.compile(r"\.\./shared|DESIGN\.md|DEPENDENCY-NOTES")
    here = Path(__file__).resolve().relative_to(ROOT).as_posix()
    offenders = [
        path for path in tracked if path != here and outside.search((ROOT / path).read_text(errors="ignore"))
    ]
    assert offenders == []


def _site_imports_in_functions(path: Path) -> list[str]:
    import ast

    tree = ast.parse(path.read_text())
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "webapp"
            ]
    return found


def test_no_module_of_the_site_imports_the_site_inside_a_function() -> None:
    """Imports between the site's modules sit at the top, where import-linter sees them.

    (synth's engines are imported where they are used on purpose: the web tier never loads them.)
    Left out: AppConfig.ready (Django's place for imports that need the app registry) and
    migrations. A positive control keeps the check honest.
    """
    hidden = []
    for path in sorted((ROOT / "webapp").rglob("*.py")):
        if "migrations" in path.parts or path.name == "apps.py":
            continue
        hidden += _site_imports_in_functions(path)
    assert not hidden, hidden
    control = ROOT / "deploy" / "gunicorn.conf.py"  # imports webapp lazily, before Django is set up
    assert _site_imports_in_functions(control)
