"""/v1/audio/speech's whole-file answer under ASGI is read a block at a time as it is sent,
not into memory whole first (Django's way with a sync iterator)."""

from __future__ import annotations

import asyncio
import os
import warnings
from pathlib import Path

import pytest

# Closing a response sends request_finished, whose handler checks every database connection the
# process holds; with one left open by an earlier test, that is database access.
pytestmark = pytest.mark.django_db

BLOCK = 64 * 1024  # what Django's ASGI handler sets on a FileResponse
MIB = 1024 * 1024


def _audio(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / "a.wav"
    path.write_bytes(data)
    return path, data


def test_under_asgi_the_file_is_read_as_it_is_sent(tmp_path: Path) -> None:
    from webapp.speech.api.openai import READ_BLOCK, AudioFileResponse

    assert READ_BLOCK == MIB
    path, data = _audio(tmp_path, 2 * MIB + 123)
    handle = open(path, "rb")
    response = AudioFileResponse(handle, content_type="audio/wav")
    response.block_size = BLOCK
    assert response["Content-Length"] == str(len(data))

    async def consume() -> tuple[list[bytes], int]:
        parts: list[bytes] = []
        read_when_first_sent = -1
        async for part in response.__aiter__():
            if not parts:
                read_when_first_sent = handle.tell()
            parts.append(part)
        return parts, read_when_first_sent

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Django warns when it lists a sync iterator whole
        parts, read_when_first_sent = asyncio.run(consume())
    response.close()
    assert b"".join(parts) == data
    assert read_when_first_sent == MIB  # one block read, not the whole file
    assert [len(p) for p in parts] == [MIB, MIB, 123]
    assert handle.closed


def test_under_wsgi_it_is_the_same_file(tmp_path: Path) -> None:
    from webapp.speech.api.openai import AudioFileResponse

    path, data = _audio(tmp_path, 3 * BLOCK)
    response = AudioFileResponse(open(path, "rb"), content_type="audio/wav")
    assert b"".join(response) == data
    response.close()


def test_a_file_of_one_block_is_read_at_once_with_the_same_headers(tmp_path: Path) -> None:
    from django.http import HttpResponse

    from webapp.speech.api.openai import READ_BLOCK, AudioFileResponse, audio_response

    path, data = _audio(tmp_path, READ_BLOCK)
    small = audio_response(str(path), "audio/wav")
    assert type(small) is HttpResponse and small.content == data  # no hop per block to send it
    whole = AudioFileResponse(open(path, "rb"), content_type="audio/wav")
    assert dict(small.items()) == dict(whole.items())  # type, length, disposition
    whole.close()
    path.write_bytes(data + b"!")
    large = audio_response(str(path), "audio/wav")
    assert isinstance(large, AudioFileResponse) and large["Content-Length"] == str(READ_BLOCK + 1)
    large.close()
