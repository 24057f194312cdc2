"""tests/containers runs only when asked for: `make test-containers` (pytest -m containers).

Its test builds on podman and images that `make test` neither installs nor builds, so a run
whose marker expression does not name ``containers`` (`make test` gives none)
leaves those tests out, as deselected, instead of failing them.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "containers" in (config.option.markexpr or ""):
        return
    left_out = [item for item in items if item.get_closest_marker("containers")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("containers")]
