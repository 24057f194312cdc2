"""The voice-prompt decode child is kept from what the service holds (synth/prompt.py).

The probe (tests/prompt_probe.py) is launched exactly as the decoder is, confines itself as
the decoder does, then tries to read a secret beside the upload, to connect to a listener on
127.0.0.1 and to see the parent's environment and descriptors.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from synth import landlock, prompt
from synth.prompt import PromptLimits, PromptRejected, prepare_prompt, run_child, sandbox_mode

PROBE = Path(__file__).resolve().parents[2] / "prompt_probe.py"
HAS_BWRAP = shutil.which("bwrap") is not None


class _Listener:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Any:
    lst = _Listener()
    yield lst
    lst.close()


def _probe(tmp_path: Path, mode: str, port: int, probe: Path = PROBE, niceness: int = 0) -> dict[str, Any]:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "django_secret_key").write_text("s3cret")
    upload = tmp_path / "spool" / "upload.wav"
    upload.parent.mkdir()
    upload.write_bytes(b"RIFF....WAVE")
    out = tmp_path / "media" / "voice.wav"
    out.parent.mkdir()
    limits = PromptLimits(max_bytes=1 << 20, sandbox=mode, niceness=niceness)
    os.environ["DATABASE_URL"] = "postgres://tts:pw@127.0.0.1/tts"
    inherited = os.open(secrets / "django_secret_key", os.O_RDONLY)
    os.set_inheritable(inherited, True)
    try:
        done = run_child(
            [
                str(probe),
                str(upload),
                str(out),
                json.dumps(asdict(limits)),
                str(secrets / "django_secret_key"),
                str(port),
            ],
            str(upload),
            str(out),
            limits,
            extra_read=(str(probe),),
        )
    finally:
        os.close(inherited)
        del os.environ["DATABASE_URL"]
    assert done.returncode == 0, done.stderr.decode()
    report: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    report["inherited_fd"] = inherited
    return report


def _assert_always(report: dict[str, Any]) -> None:
    # bubblewrap adds PWD for the folder it starts the child in ("/").
    assert set(report["environ"]) - {"PWD"} == set(prompt._CHILD_ENV), report["environ"]
    assert report["inherited_fd"] not in report["fds"], report["fds"]
    # What it must still do: read the upload, write beside its output.
    assert report["src_bytes"] == 12 and report["wrote_dst"], report


def test_it_starts_the_child_with_an_empty_environment_and_no_inherited_descriptors(
    tmp_path: Path, listener: _Listener
) -> None:
    report = _probe(tmp_path, "limits", listener.port)
    _assert_always(report)
    assert report["applied"] == "limits"


@pytest.mark.skipif(landlock.abi_version() < 1, reason="this kernel offers no Landlock")
def test_under_landlock_the_child_reads_no_secret_and_connects_nowhere(
    tmp_path: Path, listener: _Listener
) -> None:
    report = _probe(tmp_path, "landlock", listener.port)
    _assert_always(report)
    assert report["applied"].startswith("landlock, landlock abi")
    assert "secret" not in report and report["secret_error"] == 13  # EACCES
    if landlock.abi_version() >= 4:  # TCP rules came with ABI 4
        assert "connected" not in report and report["connect_error"] == 13
        assert listener.accepted == 0


@pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap is not installed (deploy/bootstrap.sh installs it)")
def test_under_bubblewrap_the_child_has_its_own_namespaces_and_no_network(
    tmp_path: Path, listener: _Listener
) -> None:
    assert sandbox_mode("auto") == "bubblewrap", "bwrap is installed but this host refuses it namespaces"
    report = _probe(tmp_path, "bubblewrap", listener.port)
    _assert_always(report)
    assert report["applied"].startswith("bubblewrap")
    assert "secret" not in report  # not even mounted in its namespace
    assert "connected" not in report and listener.accepted == 0
    assert report["pid"] < 10  # its own pid namespace


@pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap is not installed (deploy/bootstrap.sh installs it)")
def test_under_bubblewrap_paths_under_tmp_stay_visible(tmp_path: Path, listener: _Listener) -> None:
    """A checkout or venv under /tmp (CI clones there) is mounted above the child's private /tmp."""
    probe = tmp_path / "probe_copy.py"
    probe.write_text(PROBE.read_text())
    assert str(probe).startswith("/tmp/")
    report = _probe(tmp_path, "bubblewrap", listener.port, probe=probe)
    _assert_always(report)


@pytest.mark.parametrize("mode", ["limits", "bubblewrap"])
def test_the_child_runs_at_the_niceness_asked_for_and_its_parent_keeps_its_own(
    tmp_path: Path, listener: _Listener, mode: str
) -> None:
    _skip_unless_available(mode)
    before = os.nice(0)
    report = _probe(tmp_path, mode, listener.port, niceness=7)
    assert report["niceness"] == before + 7
    assert os.nice(0) == before


def test_a_named_sandbox_the_host_lacks_stops_instead_of_running_unconfined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prompt, "_bubblewrap_usable", lambda: False)  # a host without bwrap
    with pytest.raises(prompt.SandboxUnavailable, match="bubblewrap"):
        sandbox_mode("bubblewrap")
    with pytest.raises(prompt.SandboxUnavailable, match="unknown"):
        sandbox_mode("chroot")
    assert sandbox_mode("auto") == ("landlock" if landlock.abi_version() >= 1 else "limits")


def _skip_unless_available(mode: str) -> None:
    available = {
        "limits": True,
        "landlock": landlock.abi_version() >= 1,
        "bubblewrap": prompt._bubblewrap_usable(),
    }
    if not available[mode]:
        pytest.skip(f"{mode} is not available here")


@pytest.mark.parametrize("mode", ["limits", "landlock", "bubblewrap"])
@pytest.mark.parametrize("suffix", ["wav", "mp3", "webm"])
def test_a_real_prompt_decodes_in_every_sandbox(tmp_path: Path, mode: str, suffix: str) -> None:
    """The sandbox leaves the decoders what they need: libsndfile (wav, mp3) and FFmpeg (webm)."""
    _skip_unless_available(mode)
    import av

    rate = 24000
    tone = (0.3 * np.sin(2 * np.pi * 180 * np.arange(rate * 5) / rate)).astype(np.float32)
    upload = tmp_path / f"upload.{suffix}"
    if suffix == "webm":
        with av.open(str(upload), "w", format="webm") as out:
            stream = out.add_stream("libopus", rate=48000, layout="mono")
            frame = av.AudioFrame.from_ndarray(np.repeat(tone, 2)[None, :], format="flt", layout="mono")
            frame.sample_rate = 48000
            for packet in stream.encode(frame):
                out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
    else:
        sf.write(upload, tone, rate, format=suffix.upper())
    target = tmp_path / "out" / "voice.wav"
    target.parent.mkdir()
    stats = prepare_prompt(str(upload), str(target), PromptLimits(max_bytes=1 << 22, sandbox=mode))
    sniffed = {"wav": "wav", "mp3": "mpeg", "webm": "webm"}  # libsndfile's MP3 carries no ID3 tag
    assert stats.container == sniffed[suffix] and 4.5 < stats.duration_seconds < 5.5
    assert sf.info(target).samplerate == prompt.CANONICAL_RATE


def _id3_playlist(segment: str) -> bytes:
    """An HLS playlist behind an ID3v2 tag: sniffed as MP3, and FFmpeg's probe skips ID3 tags."""
    playlist = (
        f"#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXTINF:6.0,\n{segment}\n#EXT-X-ENDLIST\n"
    ).encode()
    return b"ID3\x04\x00\x00" + struct.pack(">I", 0) + playlist


@pytest.mark.parametrize("mode", ["limits", "landlock", "bubblewrap"])
def test_an_m3u8_upload_that_begins_with_id3_never_reaches_the_hls_demuxer(
    tmp_path: Path, listener: _Listener, mode: str
) -> None:
    _skip_unless_available(mode)
    rate = 16000
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(rate * 6) / rate)).astype(np.float32)
    victim = tmp_path / "victim.wav"
    sf.write(victim, tone, rate)  # a file outside the upload a playlist could pull in
    for segment in (str(victim), f"http://127.0.0.1:{listener.port}/segment.ts"):
        upload = tmp_path / "upload.m3u8"
        upload.write_bytes(_id3_playlist(segment))
        out = tmp_path / "voice.wav"
        with pytest.raises(PromptRejected) as refused:
            prepare_prompt(str(upload), str(out), PromptLimits(max_bytes=1 << 20, sandbox=mode))
        assert refused.value.code in ("invalid_audio", "unsupported_media_type")
        assert not out.exists()
    assert listener.accepted == 0
