"""Conventions with one owner, checked over the source: a module that takes its own way fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK_OWNER = Path("webapp/tenants/locks.py")
ROW_LOCKS = ("FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE")


def _receiver_root(node: ast.expr) -> str:
    """``Organization`` for ``Organization.objects.filter(...).select_for_update``."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return ""


def _text(node: ast.JoinedStr | ast.Constant) -> str:
    """A string's text, an f-string's expressions as their source (``{Organization._meta.db_table}``)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else ""
    return "".join(
        str(part.value) if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
        for part in node.values
        if isinstance(part, ast.Constant | ast.FormattedValue)
    )


def tenant_locks(source: str) -> list[int]:
    """Lines of ``source`` that lock a tenant row: ``Organization...select_for_update()``, or SQL
    naming the tenants' table with a row lock."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "select_for_update"
            and _receiver_root(node.func.value) == "Organization"
        ):
            found.append(node.lineno)
        elif isinstance(node, ast.JoinedStr | ast.Constant):
            text = _text(node)
            names_tenants = "Organization._meta.db_table" in text or "tenants_organization" in text
            if names_tenants and any(lock in text.upper() for lock in ROW_LOCKS):
                found.append(node.lineno)
    return found


def test_only_the_tenant_lock_module_locks_a_tenant_row() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "webapp").rglob("*.py"))
        if path.relative_to(ROOT) != LOCK_OWNER and "migrations" not in path.parts
        for line in tenant_locks(path.read_text())
    ]
    assert offenders == [], f"lock a tenant through webapp.tenants.locks, not: {offenders}"


def test_it_sees_a_tenant_locked_by_the_orm_or_by_sql() -> None:
    assert tenant_locks("Organization.objects.select_for_update().get(pk=1)\n") == [1]
    assert tenant_locks("x = Organization.objects.filter(pk=1).select_for_update(no_key=True).first()\n") == [
        1
    ]
    assert tenant_locks('q = f"SELECT 1 FROM {Organization._meta.db_table} WHERE id = %s FOR UPDATE"\n') == [
        1
    ]
    assert tenant_locks("Voice.objects.select_for_update().get(pk=1)\n") == []


JOB_OWNER = Path("webapp/speech/services/jobview.py")
# Keys only a job's rendering writes: a dictionary with one of them is a job shown on some wire.
JOB_KEYS = {"audio_url", "queue_position", "eta_seconds", "download_url"}


def job_renderings(source: str) -> list[int]:
    """Lines of ``source`` that write a job for a wire: a dict literal or a subscript store with one of
    ``JOB_KEYS``, or an error object made of a job's ``error_code``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            from_job = any(isinstance(v, ast.Attribute) and v.attr == "error_code" for v in node.values)
            if keys & JOB_KEYS or (from_job and "code" in keys):
                found.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if isinstance(node.slice, ast.Constant) and node.slice.value in JOB_KEYS:
                found.append(node.lineno)
    return found


def test_only_the_job_view_renders_a_job() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "webapp").rglob("*.py"))
        if path.relative_to(ROOT) != JOB_OWNER and "migrations" not in path.parts
        for line in job_renderings(path.read_text())
    ]
    assert offenders == [], f"render a job through webapp.speech.services.jobview.JobView, not: {offenders}"


def test_it_sees_a_job_rendered_by_a_literal_or_a_store() -> None:
    assert job_renderings('d = {"id": 1, "eta_seconds": eta}\n') == [1]
    assert job_renderings('data["audio_url"] = origin + path\n') == [1]
    assert job_renderings('e = {"code": job.error_code, "message": job.error_message}\n') == [1]
    assert job_renderings('d = {"id": 1, "status": "ok"}\nx = data["audio_url"]\n') == []
