"""The stream file: records a reader can follow while they are written, and the writer's growth hook."""

from __future__ import annotations

from pathlib import Path

from synth.stream import StreamReader, StreamWriter


def test_the_writer_says_it_grew_after_the_header_each_sentence_and_the_end(tmp_path: Path) -> None:
    path = str(tmp_path / "job.stream.part")
    grew: list[int] = []
    writer = StreamWriter(path, on_grew=lambda: grew.append(1))
    writer.open(22050, 20)
    assert len(grew) == 1
    with open(path, "rb") as handle:
        reader = StreamReader(handle)
        writer.audio(b"\x01\x00" * 100)
        assert len(grew) == 1  # audio alone: its sentence is not complete yet
        writer.sentence_done(12)
        assert len(grew) == 2 and reader.read() == b"\x01\x00" * 100  # on disk when told
        writer.audio(b"\x02\x00" * 50)
        writer.sentence_done(8)
        writer.finish()
        assert len(grew) == 4 and reader.read() == b"\x02\x00" * 50
        assert reader.sample_rate == 22050 and reader.total_chars == 20 and reader.ended
        assert reader.characters_heard(200) == 12 and reader.characters_heard(300) == 20
