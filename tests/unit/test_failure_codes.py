"""A failed job's ``error.code``: webapp.errors.JobFailureCode, synth's codes and docs/api.md agree.

The codes reach a job from two places: the service writes them itself (the
worker, the reaper, housekeeping, voice deletion: found here by reading
webapp/'s source) and synth raises them as ``SynthError.code``, which the worker
passes on (``synth.errors.SYNTH_ERROR_CODES``). Every one must be a member, every
member must come from one of the two, and docs/api.md has one row per member.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import synth.errors
from synth.errors import SYNTH_ERROR_CODES, SynthError
from webapp.errors import JobFailureCode

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api.md"
TABLE_HEADING = "### Job failure codes"
ACTIONS = ("retry as is", "retry later", "change the request", "contact the operator")

# synth codes that are no job's failure code, and why; of_synth still gives them a member.
NOT_JOB_FAILURES = {
    "canceled": "synth's Cancelled: the worker ends the job canceled (or hands it back), never failed",
    "audio_rejected": "a voice upload refused (synth.prompt); answered 400 at upload, no job runs",
    "synth_error": "SynthError's default; nothing raises it bare, and of_synth makes it synthesis_failed",
}

# Calls that end a job failed: the code is a literal among the first two arguments or error_code=.
FAIL_CALLS = {"_fail", "_failed", "fail_job", "_end"}
# Functions whose string results are failure codes the worker writes.
CODE_FUNCTIONS = {"storage_error_code"}


# --------------------------------------------------------------------- docs/api.md


def _table_rows() -> list[list[str]]:
    """The cells of each row of docs/api.md's "Job failure codes" table, header and rule left out."""
    lines = DOC.read_text().splitlines()
    assert TABLE_HEADING in lines, f"docs/api.md has no {TABLE_HEADING!r} section"
    rows: list[list[str]] = []
    for line in lines[lines.index(TABLE_HEADING) + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    assert rows[:2] and rows[0][0] == "code", "the table's first column must be 'code'"
    return rows[2:]


def _documented() -> list[str]:
    codes = []
    for cells in _table_rows():
        match = re.fullmatch(r"`([a-z_]+)`", cells[0])
        assert match, f"a row of {TABLE_HEADING!r} does not start with one `code`: {cells}"
        codes.append(match.group(1))
    return codes


def test_the_api_docs_table_lists_every_code() -> None:
    documented = _documented()
    twice = sorted(code for code, n in Counter(documented).items() if n > 1)
    assert not twice, f"listed more than once in docs/api.md: {twice}"
    members = {str(code) for code in JobFailureCode}
    missing = sorted(members - set(documented))
    assert not missing, f"JobFailureCode members without a row in docs/api.md: {missing}"
    unknown = sorted(set(documented) - members)
    assert not unknown, f"rows of docs/api.md that are no JobFailureCode member: {unknown}"


def test_every_row_says_what_happened_and_what_to_do() -> None:
    for cells in _table_rows():
        assert len(cells) == 3 and all(cells), f"a row needs code, what happened, what to do: {cells}"
        assert any(action in cells[2] for action in ACTIONS), f"{cells[0]}: say one of {ACTIONS}"


# --------------------------------------------------------------------- synth's codes


def test_every_synth_code_maps_to_a_member() -> None:
    for code in sorted(SYNTH_ERROR_CODES):
        member = JobFailureCode.of_synth(code)
        assert isinstance(member, JobFailureCode)
        if code in NOT_JOB_FAILURES:
            assert member is JobFailureCode.SYNTHESIS_FAILED, code
            continue
        assert code in set(JobFailureCode), (
            f"synth raises {code!r}, which the worker writes as the job's error.code, but it is no "
            "JobFailureCode member: add one (and its row in docs/api.md), or list it in NOT_JOB_FAILURES"
        )
        assert member is JobFailureCode(code)


def test_the_codes_not_mapped_are_still_synth_codes() -> None:
    stale = sorted(set(NOT_JOB_FAILURES) - SYNTH_ERROR_CODES)
    assert not stale, f"NOT_JOB_FAILURES names codes synth no longer has: {stale}"
    assert not set(NOT_JOB_FAILURES) & set(JobFailureCode)


def test_an_unknown_synth_code_is_synthesis_failed() -> None:
    assert JobFailureCode.of_synth("no_such_code") is JobFailureCode.SYNTHESIS_FAILED
    assert JobFailureCode.of_synth("timeout") is JobFailureCode.TIMEOUT


def test_synth_registers_every_code_it_raises() -> None:
    """``class X(SynthError, code=...)`` and ``SynthError(..., code=...)`` in synth/ and webapp/."""
    classes = {
        name
        for name, obj in vars(synth.errors).items()
        if isinstance(obj, type) and issubclass(obj, SynthError)
    }
    found: list[tuple[str, str]] = []
    for where, tree in _sources("synth", "webapp"):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and where.startswith("synth/"):
                keywords = node.keywords
            elif isinstance(node, ast.Call) and _name(node.func) in classes:
                keywords = node.keywords
                if len(node.args) > 1 and _literal(node.args[1]) is not None:
                    found.append((f"{where}:{node.lineno}", str(_literal(node.args[1]))))
            else:
                continue
            for kw in keywords:
                if kw.arg == "code" and _literal(kw.value) is not None:
                    found.append((f"{where}:{node.lineno}", str(_literal(kw.value))))
    assert found, "the scan found no SynthError code at all; is it looking in the right place?"
    unknown = [f"{at}: {code!r}" for at, code in found if code not in SYNTH_ERROR_CODES]
    assert not unknown, f"codes raised but not in synth.errors.SYNTH_ERROR_CODES: {unknown}"


# --------------------------------------------------------------------- what webapp writes


def _sources(*folders: str) -> Iterator[tuple[str, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" not in path.parts:
                yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _codes_in(node: ast.expr) -> Iterator[str]:
    """The codes an argument names: "worker_lost", JobFailureCode.WORKER_LOST, a ? b : c of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Attribute) and _name(node.value) == "JobFailureCode" and node.attr.isupper():
        member = JobFailureCode.__members__.get(node.attr)
        yield str(member) if member is not None else f"JobFailureCode.{node.attr}"
    elif isinstance(node, ast.Attribute) and node.attr == "value":
        yield from _codes_in(node.value)
    elif isinstance(node, ast.IfExp):
        yield from _codes_in(node.body)
        yield from _codes_in(node.orelse)
    elif isinstance(node, ast.Call) and _name(node.func) in {"JobFailureCode", "of_synth"} and node.args:
        yield from (str(JobFailureCode.of_synth(code)) for code in _codes_in(node.args[0]))


def _written_codes() -> list[tuple[str, str]]:
    """(file:line, code) of every failure code webapp/ writes itself."""
    found: list[tuple[str, str]] = []
    for where, tree in _sources("webapp"):
        for node in ast.walk(tree):
            args: list[ast.expr] = []
            if isinstance(node, ast.Call):
                if _name(node.func) in FAIL_CALLS:
                    args += node.args[:2]
                args += [kw.value for kw in node.keywords if kw.arg == "error_code"]
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == "error_code" for t in targets):
                    args.append(node.value)
            elif isinstance(node, ast.FunctionDef) and node.name in CODE_FUNCTIONS:
                args += [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
            found += [(f"{where}:{arg.lineno}", code) for arg in args for code in _codes_in(arg)]
    return found


def test_every_code_the_worker_writes_is_a_member() -> None:
    members = set(JobFailureCode)
    unknown = sorted(f"{at}: {code!r}" for at, code in _written_codes() if code not in members)
    assert not unknown, f"failure codes written in webapp/ that are no JobFailureCode member: {unknown}"


def test_every_member_is_written_or_raised_by_synth() -> None:
    """No dead member; and a scan that stopped finding the codes (the code moved) fails here."""
    written = {code for _, code in _written_codes()}
    dead = sorted(str(m) for m in JobFailureCode if m not in written and m not in SYNTH_ERROR_CODES)
    assert not dead, f"members neither written in webapp/ nor raised by synth: {dead}"
