"""The words check of a consent recording, in a child process of its own.

The recogniser (``synth.consent.check_words``, pocketsphinx) loads a model of tens of
megabytes and spends about a second of CPU on a recording: the web process that takes the
upload starts ``python -m synth.consent_run`` inside its decode slot instead, so it holds
neither, and a recogniser that hangs is killed at the timeout. The child reads only the
canonical recording the decode child wrote (16 kHz mono WAV), never the upload.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from synth.consent import LANGUAGES, WordsVerdict


def recognises(language: str) -> bool:
    """Whether recordings in ``language`` (a tag: en, en-GB) can be checked by speech recognition."""
    return language.lower().split("-")[0] in LANGUAGES


def check_words_in_child(path: str, phrase: str, code: str, timeout: float) -> WordsVerdict:
    """:func:`synth.consent.check_words` on the WAV at ``path``, in a child; a child that fails or
    runs past ``timeout`` gives ``consent_unclear`` (nothing was heard for sure)."""
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
    if "PATH" in os.environ:
        env["PATH"] = os.environ["PATH"]
    command = [sys.executable, "-m", "synth.consent_run", path, code, phrase]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        reply = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        reply = None
    if not isinstance(reply, dict):
        return WordsVerdict(False, None, "consent_unclear")
    return WordsVerdict(bool(reply["passed"]), reply.get("heard_code"), str(reply.get("reason", "")))


def main(argv: list[str]) -> int:
    import soundfile

    from synth.consent import check_words

    path, code, phrase = argv
    samples, rate = soundfile.read(path, dtype="float32", always_2d=False)
    verdict = check_words(samples, int(rate), phrase, code)
    print(json.dumps({"passed": verdict.passed, "heard_code": verdict.heard_code, "reason": verdict.reason}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
