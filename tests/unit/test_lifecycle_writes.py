"""Only the job lifecycle writes a job's status (the package webapp/speech/lifecycle/).

Read from the code, not run: any module of webapp/ outside the lifecycle that
sets ``status`` to a job state (``.update(status=...)``, ``.create(status=...)``,
``SynthesisJob(status=...)``, ``job.status = ...``) or whose SQL sets it fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from webapp.speech.models import JobStatus

ROOT = Path(__file__).resolve().parents[2]
LIFECYCLE = ROOT / "webapp" / "speech" / "lifecycle"
JOB_STATES = {s.name for s in JobStatus} | {s.value for s in JobStatus}
SQL_STATUS_WRITE = re.compile(r"\bSET\b[^;]*\bstatus\s*=", re.IGNORECASE | re.DOTALL)
# Calls whose ``status=`` states a condition, not a change.
READING_CALLS = {"filter", "exclude", "get", "Q", "When", "Count", "Sum", "aggregate", "annotate"}


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute in an expression (``SynthesisJob.Status.RUNNING`` -> all three)."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
    return out


def _is_job_state(value: ast.AST) -> bool:
    """A value that names a job state: ``Status.RUNNING``, ``JobStatus.FAILED``, ``"canceled"``."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value in {s.value for s in JobStatus}
    names = _names(value)
    return bool(names & {"Status", "JobStatus"}) and bool(names & JOB_STATES)


def _is_job_model(value: ast.AST) -> bool:
    return bool(_names(value) & {"SynthesisJob", "jobs"})


def status_writes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in READING_CALLS:
                continue
            receiver = func.value if isinstance(func, ast.Attribute) else func
            for kw in node.keywords:
                if kw.arg != "status":
                    continue
                model_write = name in {"update", "create", "SynthesisJob"} and _is_job_model(receiver)
                # A voice's status (Voice.Status.READY) is not a job's.
                if (_is_job_state(kw.value) or model_write) and "Voice" not in _names(kw.value) | _names(
                    receiver
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "status" and _is_job_state(value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "status"
                    and _is_job_state(node.value)
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        elif isinstance(node, ast.Constant | ast.JoinedStr):
            text = node.value if isinstance(node, ast.Constant) else ast.unparse(node)
            if isinstance(text, str) and SQL_STATUS_WRITE.search(text) and "synthesisjob" in text.lower():
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _modules() -> list[Path]:
    return [
        p
        for p in sorted((ROOT / "webapp").rglob("*.py"))
        if LIFECYCLE not in p.parents and "migrations" not in p.parts
    ]


def test_no_module_outside_the_lifecycle_writes_a_job_status() -> None:
    writes = [w for path in _modules() for w in status_writes(path)]
    assert writes == [], f"a job's status is written outside webapp/speech/lifecycle/: {writes}"


def test_the_check_finds_the_lifecycle_writes() -> None:
    """The detector is not blind: it sees the lifecycle's own writes (claims, completion, ends)."""
    assert sum(len(status_writes(p)) for p in sorted(LIFECYCLE.glob("*.py"))) >= 4


def test_the_check_sees_each_kind_of_write(tmp_path: Path) -> None:
    sample = ROOT / "webapp" / "_sample_for_test.py"
    code = (
        "SynthesisJob.objects.filter(id=1).update(status=SynthesisJob.Status.FAILED)\n"
        "job.status = Status.CANCELED\n"
        "SynthesisJob(status='queued')\n"
        "SQL = 'UPDATE speech_synthesisjob SET status = 1'\n"
        "Voice.objects.filter(id=1).update(status=Voice.Status.READY)\n"
    )
    try:
        sample.write_text(code)
        assert len(status_writes(sample)) == 4
    finally:
        sample.unlink()


def _private_uses(path: Path) -> list[str]:
    """``lifecycle._name`` and ``from webapp.speech.lifecycle[.module] import _name`` in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id == "lifecycle":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} lifecycle.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("webapp.speech.lifecycle"):
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {a.name}"
                for a in node.names
                if a.name.startswith("_")
            ]
    return found


def test_nothing_outside_the_lifecycle_uses_its_private_steps() -> None:
    paths = [*_modules(), *sorted((ROOT / "tests").rglob("*.py"))]
    uses = [u for path in paths if path != Path(__file__).resolve() for u in _private_uses(path)]
    assert uses == [], f"private steps of the lifecycle used outside it: {uses}"
