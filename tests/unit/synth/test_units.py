"""synth.units: text arriving in pieces cut into speakable units (docs/api.md, "Realtime sessions")."""

from __future__ import annotations

from synth.units import CutPolicy, UnitCutter


def feed(cutter: UnitCutter, pieces: list[str]) -> list[str]:
    return [unit.text for piece in pieces for unit in cutter.add(piece)]


def test_it_cuts_at_a_sentence_end_once_whitespace_follows() -> None:
    cutter = UnitCutter()
    assert feed(cutter, ["Hello there", "."]) == []  # "." could still be "...", or "3.5"
    assert feed(cutter, [" How"]) == ["Hello there."]
    assert cutter.waiting == len(" How")


def test_it_does_not_cut_a_decimal_or_an_abbreviation_arriving_in_pieces() -> None:
    cutter = UnitCutter()
    assert feed(cutter, ["It costs 3.", "5 euros, e.g", ".", "g."]) == []
    assert [u.text for u in cutter.flush()] == ["It costs 3.5 euros, e.g.g."]


def test_closing_quotes_and_brackets_stay_with_their_sentence() -> None:
    cutter = UnitCutter()
    assert feed(cutter, ['She said "stop!" then left. '])[0] == 'She said "stop!"'
    assert feed(UnitCutter(), ["(Really?) Yes. "]) == ["(Really?)", "Yes."]


def test_the_first_unit_after_a_flush_is_cut_at_a_clause_once_enough_waits() -> None:
    cutter = UnitCutter(CutPolicy(first_clause_chars=24, clause_chars=100))
    assert feed(cutter, ["Well, "]) == []  # a clause, but too short to speak alone
    assert feed(cutter, ["let me think about that, "]) == ["Well, let me think about that,"]
    # Later units wait for clause_chars before a clause boundary is enough.
    assert feed(cutter, ["and then, ", "some more words, "]) == []


def test_without_any_boundary_it_cuts_at_the_last_space_before_max_chars() -> None:
    cutter = UnitCutter(CutPolicy(max_chars=40))
    units = feed(cutter, ["word " * 20])
    assert units and all(len(u) <= 40 for u in units)
    assert all(u.endswith("word") for u in units)


def test_flush_makes_whatever_waits_one_unit_and_resets_the_first_unit_threshold() -> None:
    cutter = UnitCutter()
    feed(cutter, ["This is a sentence. ", "and a tail"])
    assert [u.text for u in cutter.flush()] == ["and a tail"]
    assert cutter.flush() == []  # nothing waits: no empty unit
    assert feed(cutter, ["Again, just more words here, "]) == ["Again, just more words here,"]


def test_clear_drops_what_waits_and_says_how_much() -> None:
    cutter = UnitCutter()
    feed(cutter, ["Half a sente"])
    assert cutter.clear() == len("Half a sente")
    assert cutter.waiting == 0 and cutter.flush() == []


def test_offsets_place_each_unit_in_the_text_as_sent() -> None:
    cutter = UnitCutter()
    pieces = ["  One. ", "Two, and", " three! ", "Four"]
    whole = "".join(pieces)
    units = [u for piece in pieces for u in cutter.add(piece)] + cutter.flush()
    assert [u.text for u in units] == ["One.", "Two, and three!", "Four"]
    assert all(whole[u.start : u.end] == u.text for u in units)
    cutter.clear()
    more = cutter.add("Five. ") + cutter.flush()
    assert more[0].start == len(whole) and more[0].text == "Five."
