"""pip's configuration of this machine, made usable inside an image build (deploy/container/build.sh).

A build here must see the indexes the host sees: its pip configuration (files and PIP_*
variables, as ``pip config list`` merges them), the local folders it names (find-links,
``file://`` indexes: here /opt/wheels, which holds the CPU torch build the lock pins) and the
CA bundle. With the CA bundle alone pip reaches PyPI and takes its CUDA torch instead.

``python pip_config.py OUT`` writes OUT/pip.conf, with every local path rewritten to where the
Dockerfile mounts it, and OUT/pip-constraints.txt (the constraint files, joined), and prints
the ``podman build`` arguments that pass them in, one a line:

- ``--secret id=pip.conf`` (mounted at /run/secrets/pip.conf, read through PIP_CONFIG_FILE),
  ``--secret id=pip-ca`` and ``--secret id=pip-constraints``: files, never in a layer;
- ``--build-context pip-local=DIR``: the deepest folder holding every local index, mounted
  read-only at /run/pip-local (the Dockerfile's stage of that name is empty by default).

Standard library only. Keys outside :data:`PASSED` (cache folders, logs, targets) stay behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

MOUNT = "/run/pip-local"
SECRETS = "/run/secrets"
# Options that describe where packages come from and how pip fetches them.
PASSED = {
    "index-url",
    "extra-index-url",
    "find-links",
    "trusted-host",
    "cert",
    "constraint",
    "timeout",
    "default-timeout",
    "retries",
    "disable-pip-version-check",
    "prefer-binary",
    "pre",
}
LOCATIONS = ("index-url", "extra-index-url", "find-links")
_LINE = re.compile(r"^(?P<section>[^.]*)\.(?P<key>[^=]+)='(?P<value>.*)'$")


def effective_config(listing: str) -> dict[str, str]:
    """``pip config list`` output -> {key: value} as `pip install` would see it."""
    # pip's order for `pip install`: [global], then [install] over it, then the variables.
    layers: dict[str, dict[str, str]] = {"global": {}, "install": {}, ":env:": {}}
    for line in listing.splitlines():
        match = _LINE.match(line.strip())
        if match and match["section"] in layers:
            layers[match["section"]][match["key"]] = match["value"]
    return {**layers["global"], **layers["install"], **layers[":env:"]}


def _local_path(item: str) -> Path | None:
    if item.startswith("file://"):
        return Path(unquote(urlsplit(item).path))
    if item.startswith("/"):
        return Path(item)
    return None


def translate(
    config: dict[str, str], environ: dict[str, str]
) -> tuple[list[str], Path | None, Path | None, list[Path]]:
    """(pip.conf lines, context folder, CA bundle, constraint files) for the build."""
    local: list[Path] = []
    for key in LOCATIONS:
        for item in config.get(key, "").split():
            path = _local_path(item)
            if path is not None and path.exists():
                local.append(path.resolve())
    root = Path(os.path.commonpath(local)) if local else None
    if root is not None and root == Path("/"):
        raise SystemExit(f"pip's local indexes share no folder below /: {', '.join(map(str, local))}")
    lines = ["[global]"]
    ca: Path | None = None
    constraints: list[Path] = []
    for key, value in sorted(config.items()):
        if key not in PASSED:
            continue
        if key in LOCATIONS:
            items = []
            for item in value.split():
                path = _local_path(item)
                if path is None:
                    items.append(item)
                elif path.exists() and root is not None:
                    inside = f"{MOUNT}/{path.resolve().relative_to(root)}".rstrip("/.")
                    items.append(f"file://{inside}" if item.startswith("file://") else inside)
                # A local path that does not exist here is left out: pip would only warn about it.
            if items:
                lines.append(f"{key} = {' '.join(items)}")
        elif key == "cert":
            ca = Path(value)
        elif key == "constraint":
            constraints += [Path(item) for item in value.split() if Path(item).is_file()]
        else:
            lines.append(f"{key} = {value}")
    if ca is None:
        # No cert of pip's own: the bundle the machine's other clients are told to use, if any.
        for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
            if environ.get(name) and Path(environ[name]).is_file():
                ca = Path(environ[name])
                break
    if ca is not None:
        lines.append(f"cert = {SECRETS}/pip-ca")
    if constraints:
        lines.append(f"constraint = {SECRETS}/pip-constraints")
    return lines, root, ca, constraints


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: pip_config.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], check=True, capture_output=True, text=True
    ).stdout
    lines, root, ca, constraints = translate(effective_config(listing), dict(os.environ))
    (out / "pip.conf").write_text("\n".join(lines) + "\n")
    args = [f"--secret=id=pip.conf,src={out / 'pip.conf'}"]
    if ca is not None:
        args.append(f"--secret=id=pip-ca,src={ca}")
    if constraints:
        joined = "".join(path.read_text().rstrip("\n") + "\n" for path in constraints)
        (out / "pip-constraints").write_text(joined)
        args.append(f"--secret=id=pip-constraints,src={out / 'pip-constraints'}")
    if root is not None:
        args.append(f"--build-context=pip-local={root}")
    print("\n".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
