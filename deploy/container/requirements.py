"""The requirements of the project's core and the named extras, one a line: what an image installs.

``python requirements.py pyproject.toml web worker`` prints the core dependencies and those of
each extra, with the project's references to its own extras (``tts-service[web]``) expanded,
so a build installs them with ``pip install -c deploy/requirements.lock -r -`` without
building the project itself (its code is copied beside the installed packages, not into them).
Standard library only: it runs in the base image before anything is installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_SELF = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)\[(?P<extras>[^\]]+)\]\s*$")


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    name = project["name"].lower()
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    out: list[str] = list(project.get("dependencies", []))
    seen: set[str] = set()
    pending = list(extras)
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"{pyproject}: no extra {extra!r} (one of {', '.join(sorted(optional))})")
        seen.add(extra)
        for requirement in optional[extra]:
            match = _SELF.match(requirement)
            if match and match["name"].lower() == name:
                pending.extend(part.strip() for part in match["extras"].split(","))
            else:
                out.append(requirement)
    return list(dict.fromkeys(out))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: requirements.py PYPROJECT EXTRA...", file=sys.stderr)
        return 2
    print("\n".join(requirements(Path(argv[0]), argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
