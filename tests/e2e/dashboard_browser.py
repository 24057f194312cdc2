"""Helpers of the dashboard's browser tests: Debian's chromium through Playwright, axe-core, e-mail files.

The browser is the system's ``/usr/bin/chromium`` (deploy/bootstrap.sh
installs it); axe-core is vendored by bootstrap into ``tests/e2e/assets/``.
"""

from __future__ import annotations

import email
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.stack import CFG

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
AXE = Path(__file__).parent / "assets" / "axe.min.js"
BASE = f"https://127.0.0.1:{CFG.https_port}"
SCREENSHOTS = CFG.path("screenshots")
MAIL_DIR = CFG.path("mail")


def axe_problems(page: Any) -> list[str]:
    """Serious and critical axe-core violations of the page, one line each."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        # Evaluated through the DevTools protocol: the page's CSP (no inline script) stays on.
        page.evaluate(AXE.read_text())
    result = page.evaluate("async () => await window.axe.run(document, {resultTypes: ['violations']})")
    lines = []
    for violation in result["violations"]:
        if violation["impact"] in ("serious", "critical"):
            targets = [str(node["target"]) for node in violation["nodes"][:3]]
            lines.append(f"{violation['id']} ({violation['impact']}): {violation['help']} at {targets}")
    return lines


# Before any script of each page (an init script runs through the DevTools protocol, outside
# the page's CSP): every Content-Security-Policy violation the page causes is kept.
CSP_WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__cspViolations.push(
  `${e.effectiveDirective} blocked ${e.blockedURI || "inline"} (${e.sourceFile || "?"}:${e.lineNumber})`));
"""


def new_context(browser: Any, **options: Any) -> Any:
    """A browser context whose pages record CSP violations (:func:`csp_violations`)."""
    ctx = browser.new_context(ignore_https_errors=True, base_url=BASE, **options)
    ctx.add_init_script(CSP_WATCH)
    ctx.set_default_timeout(20_000)
    return ctx


def csp_violations(page: Any) -> list[str]:
    """What the page's CSP refused so far (an empty list also when the page was not watched)."""
    return list(page.evaluate("() => window.__cspViolations || []"))


def check_page(page: Any, name: str) -> None:
    """Screenshot the page (a test artifact) and fail on serious or critical accessibility violations,
    and on anything its Content-Security-Policy refused (an inline style or script, say)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    problems = axe_problems(page)
    assert not problems, f"{name}: " + "; ".join(problems)
    refused = csp_violations(page)
    assert not refused, f"{name}: the CSP refused " + "; ".join(refused)


def mail_files() -> set[Path]:
    return set(MAIL_DIR.glob("*.log")) if MAIL_DIR.exists() else set()


def wait_for_link(before: set[Path], to: str, pattern: str, timeout: float = 20) -> str:
    """The first link matching ``pattern`` in a new e-mail to ``to`` (Django's file backend)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in sorted(mail_files() - before):
            for raw in re.split(r"\n-{70,}\n", path.read_text()):
                message = email.message_from_string(raw.strip())
                if to in (message.get("To") or ""):
                    body = message.get_payload(decode=True)
                    text = body.decode() if isinstance(body, bytes) else str(message.get_payload())
                    match = re.search(pattern, text)
                    if match:
                        return match.group(0)
        time.sleep(0.2)
    raise AssertionError(f"no e-mail to {to} with {pattern!r} within {timeout}s")


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
