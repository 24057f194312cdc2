"""A worker node's id is one per start of a Celery parent, also where every parent is pid 1.

Each "container" here is a real pid and UTS namespace (``unshare``) whose init is a
shell, pid 1, with the same host name as the other: the worker child's parent is pid 1
in both, as in every container of a Kubernetes deployment. The child computes its node
id as a worker child does (``recycling.node_id``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.stack import django_env

# Two "children" of one parent (pid 1 of the namespace): they must agree on their node.
_CHILD = (
    "import django, json, os; django.setup();"
    "from webapp.speech.runtime import recycling;"
    "print(json.dumps([os.getppid(), recycling.node_id()]))"
)


def _container(hostname: str) -> list[list[object]]:
    python = f"{sys.executable} -c '{_CHILD}'"
    script = f'hostname "{hostname}" && {python} && {python}; true'
    done = subprocess.run(
        ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
        env=django_env("node-id", DJANGO_SETTINGS_MODULE="tests.settings"),
        cwd=os.getcwd(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]


@pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root")
@pytest.mark.slow  # seconds of work: make test runs it, make test-fast leaves it out
def test_parents_that_are_pid_1_under_one_host_name_are_different_nodes() -> None:
    first, second = _container("tts-pod"), _container("tts-pod")
    assert [ppid for ppid, _ in first + second] == [1, 1, 1, 1]  # what the test is about
    # Children of one parent share its node; the two parents are two nodes.
    assert first[0][1] == first[1][1] and second[0][1] == second[1][1]
    assert first[0][1] != second[0][1], (first, second)
    # Readable: the host name first, the parent's pid last, as the console shows them.
    node = str(first[0][1])
    assert node.startswith("tts-pod:") and node.endswith(":1")
