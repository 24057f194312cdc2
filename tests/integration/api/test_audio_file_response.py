"""/v1/audio/speech's whole-file answer under ASGI is read a block at a time as it is sent,
not into memory whole first (Django's way with a sync iterator); under WSGI it is the same file."""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
from pathlib import Path

import pytest

# Closing a response sends request_finished, whose handler checks every database connection the
# process holds; and taking the first block settles the job (none here): database access.
pytestmark = pytest.mark.django_db

MIB = 1024 * 1024


def _audio(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / "a.wav"
    path.write_bytes(data)
    return path, data


def test_under_asgi_the_file_is_read_as_it_is_sent(tmp_path: Path) -> None:
    from webapp.speech.api.openai import READ_BLOCK, AnswerResponse

    assert READ_BLOCK == MIB
    path, data = _audio(tmp_path, 2 * MIB + 123)
    response = AnswerResponse(str(path), "audio/wav", uuid.uuid4())
    assert response["Content-Length"] == str(len(data))

    async def consume() -> list[bytes]:
        return [part async for part in response.__aiter__()]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Django warns when it lists a sync iterator whole
        parts = asyncio.run(consume())
    response.close()
    assert b"".join(parts) == data
    assert [len(p) for p in parts] == [MIB, MIB, 123]  # a block at a time


def test_under_wsgi_it_is_the_same_file(tmp_path: Path) -> None:
    from webapp.speech.api.openai import AnswerResponse

    path, data = _audio(tmp_path, 3 * 64 * 1024)
    response = AnswerResponse(str(path), "audio/wav", uuid.uuid4())
    assert b"".join(response) == data
    response.close()
