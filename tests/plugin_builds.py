"""Helpers of the engine plugin tests: the tiny engine built into a real distribution, a tenant."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deploy.provision import ROOT
from tests.integration.api.conftest import ApiClient

PLUGIN_SOURCE = Path(__file__).resolve().parent / "engine_plugins" / "tiny"


def build_plugin(tmp: Path) -> Path:
    """The tiny engine installed into a folder of its own, as pip installs any package."""
    source = tmp / "source"
    shutil.copytree(PLUGIN_SOURCE, source)  # the build writes beside its sources
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--target", str(site), str(source)],
        check=True,
        capture_output=True,
    )
    assert (site / "tiny_tts_engine-0.1.0.dist-info" / "entry_points.txt").is_file()
    return site


def python_path(site: Path) -> str:
    # The checkout first (its own code, not another checkout's editable install), then the package.
    return os.pathsep.join([str(ROOT), str(site)])


def make_client() -> tuple[Any, str, ApiClient]:
    """A tenant (committed rows) with a key, and a JSON client that sends it."""
    from webapp.tenants.models import Plan
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    plan = Plan.objects.create(
        slug=f"plugins-{time.monotonic_ns()}",
        name="plugins",
        requests_per_minute=1000,
        max_concurrent_jobs=50,
    )
    org = create_organization("Plugins tenant", plan=plan)
    scopes = ["speech:read", "speech:write", "voices:write"]
    _, raw = create_api_key(org, "plugins key", created_by=OPERATOR, scopes=scopes)
    return org, raw, ApiClient(raw)
