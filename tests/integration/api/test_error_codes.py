"""docs/api.md's table of error codes and webapp.errors / webapp.problems say the same."""

from __future__ import annotations

import re
from pathlib import Path

from webapp.errors import ErrorCode
from webapp.problems import STATUS

DOC = Path(__file__).resolve().parents[3] / "docs" / "api.md"


def _documented() -> dict[str, int]:
    """{code: status} from the rows of the "Codes" table (| status | `code`, ... | when |)."""
    table: dict[str, int] = {}
    for line in DOC.read_text().splitlines():
        row = re.match(r"^\|\s*(\d{3})\s*\|(.*?)\|", line)
        if row:
            for code in re.findall(r"`([a-z_]+)`", row.group(2)):
                assert code not in table, f"{code} is listed twice in docs/api.md"
                table[code] = int(row.group(1))
    return table


def test_every_error_code_is_documented_with_its_status() -> None:
    documented = _documented()
    assert {str(code): STATUS[code] for code in ErrorCode} == documented


def test_every_error_code_has_an_http_status() -> None:
    assert set(STATUS) == set(ErrorCode)
