"""The files of one attempt: each claim writes only files named with its fencing token.

Attempt N of a job writes ``audio/<org>/<job>.<N>.<fmt>``; ``synth`` writes its
temporary files (``.<job>.<N>.<fmt>.<random>.part``, the stream file
``.<job>.<N>.<fmt>.stream.part``) beside it. A run removes only its own files;
the files of a dead owner are removed by whoever learns it is dead (the next
claim, the reaper on the same host), and any other leftover by the orphan
sweep (webapp/housekeeping/disk.py). The job row's ``audio_path`` says which
attempt's file is the job's audio.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import logging
import os
from typing import Any

from django.db import InterfaceError, OperationalError

from webapp.errors import JobFailureCode
from webapp.speech.models import SynthesisJob
from webapp.speech.services.files import media_path

log = logging.getLogger(__name__)

_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def attempt_path(job: SynthesisJob, token: int | None = None) -> str:
    """Where attempt ``token`` (default: the job's current claim) writes: ``audio/<org>/<job>.<token>.<fmt>``."""
    token = job.claim_token if token is None else token
    return os.path.join("audio", str(job.organization_id), f"{job.id}.{token}.{job.format}")


def remove_partials(out_path: str) -> None:
    """Remove synth's temporary files of ``out_path`` (``.<name>.<random>.part``, ``.part.f32``, the stream file)."""
    directory, base = os.path.split(out_path)
    for leftover in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(base)}.*.part*")):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove partial file %s: %s", leftover, exc)


def discard_output(job_id: Any, token: int, relative: str) -> None:
    """Remove attempt ``token``'s files, unless the job row names its file as the job's audio.

    Only that attempt's files: a path not named with its token is refused, so
    no run can delete another attempt's output.
    """
    if not os.path.basename(relative).startswith(f"{job_id}.{token}."):
        log.error(
            "job %s: %s is not a file of the attempt with token %s; left alone", job_id, relative, token
        )
        return
    out_path = media_path(relative)
    remove_partials(out_path)
    try:
        kept = SynthesisJob.objects.filter(
            id=job_id, status=SynthesisJob.Status.SUCCEEDED, audio_path=relative
        ).exists()
    except (OperationalError, InterfaceError):
        return  # cannot tell: the orphan sweep decides later rather than delete a delivered file
    if not kept:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out_path)


def discard_attempt(job: SynthesisJob, token: int) -> None:
    """Remove the files of attempt ``token`` of ``job``, whose writer is known dead."""
    if token > 0:
        discard_output(job.id, token, attempt_path(job, token))


def fsync_output(path: str) -> None:
    """The file and its folder on disk before the row says succeeded (a power cut keeps both)."""
    for target, flags in ((path, os.O_RDONLY), (os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def storage_error_code(exc: BaseException) -> JobFailureCode | None:
    """``disk_full`` / ``storage_error`` when ``exc`` is a failure to write the audio, else None.

    libsndfile reports a failed write as "System error." (SF_ERR_SYSTEM) and
    leaves the reason in the C errno, which cffi keeps for the calling thread.
    """
    if isinstance(exc, OSError):
        return JobFailureCode.DISK_FULL if exc.errno in _DISK_FULL_ERRNOS else JobFailureCode.STORAGE_ERROR
    if type(exc).__name__ == "LibsndfileError" and getattr(exc, "code", None) == 2:
        try:
            import soundfile

            err = int(soundfile._ffi.errno)
        except Exception:
            err = 0
        return JobFailureCode.DISK_FULL if err in _DISK_FULL_ERRNOS else JobFailureCode.STORAGE_ERROR
    return None
