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
