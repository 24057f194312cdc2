"""Every row of docs/instructions.md is checked against the parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from synth.instructions import parse_instructions

DOC = Path(__file__).resolve().parents[3] / "docs" / "instructions.md"


def _rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in ("en", "zh"):
            rows.append((cells[0], cells[1], cells[2]))
    return rows


ROWS = _rows()


def test_table_has_enough_rows() -> None:
    assert sum(1 for r in ROWS if r[0] == "en") >= 20
    assert sum(1 for r in ROWS if r[0] == "zh") >= 20


def _expected(cell: str) -> dict[str, str]:
    if cell == "(nothing)":
        return {}
    out: dict[str, str] = {}
    key = None
    for part in cell.split(" "):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key] = value
        elif key:  # "unsupported=emotion: happy" contains a space
            out[key] += " " + part
    return out


@pytest.mark.parametrize(("language", "phrase", "expected"), ROWS, ids=[r[1] for r in ROWS])
def test_row(language: str, phrase: str, expected: str) -> None:
    result = parse_instructions(phrase)
    assert result.as_row() == _expected(expected)
    assert not result.unrecognised


def test_unrecognised_is_reported() -> None:
    result = parse_instructions("make it sparkle")
    assert result.unrecognised == ["make it sparkle"]
    assert result.as_row() == {}
