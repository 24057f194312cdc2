"""W3C Pronunciation Lexicon Specification 1.0 (``application/pls+xml``): import and export.

Import reads an untrusted document, so: the byte limit is checked before any
parsing (defusedxml does not cap size; the caller passes what it read, at most
the plan's limit), then defusedxml parses with DTDs, entity declarations and
external references all forbidden, so billion-laughs expansion and external
entities are refused before they are expanded or fetched (expat never fetches
here: no resolver is installed, and the DTD that would name one is refused).
Every refusal is a :class:`~webapp.errors.DomainError` naming the problem
(``invalid_pls`` 400); never a 500.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET  # only to build the export and for its Element type
from dataclasses import dataclass

import defusedxml
import defusedxml.ElementTree as SafeET

from synth.lexicon import Rule
from webapp.errors import DomainError, ErrorCode

PLS_NS = "http://www.w3.org/2005/01/pronunciation-lexicon"
MEDIA_TYPE = "application/pls+xml"
_N = "{" + PLS_NS + "}"
# PLS alphabet names -> ours. "ipa" is PLS's own; the x- names are the registry's private-use form.
ALPHABETS = {
    "ipa": "ipa",
    "x-arpabet": "arpabet",
    "arpabet": "arpabet",
    "x-cmu": "arpabet",
    "x-pinyin": "pinyin",
    "pinyin": "pinyin",
}
EXPORT_ALPHABET = {"ipa": "ipa", "arpabet": "x-arpabet", "pinyin": "x-pinyin"}
# Our extension for a case-sensitive grapheme (PLS leaves matching to the processor).
CASE_ATTRIBUTE = "case-sensitive"


@dataclass
class Lexicon:
    language: str
    rules: list[Rule]


def _bad(detail: str) -> DomainError:
    return DomainError(ErrorCode.INVALID_PLS, f"PLS document refused: {detail}", field="body")


def _parse_xml(data: bytes) -> ET.Element:
    try:
        return SafeET.fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DTDForbidden:
        if b"<!ENTITY" in data:
            raise _bad(
                "entity declarations (and the DTD holding them) are not accepted; "
                "nothing was expanded or fetched"
            ) from None
        if b"SYSTEM" in data or b"PUBLIC" in data:
            raise _bad("an external DTD is not accepted; nothing was fetched") from None
        raise _bad("a DTD (<!DOCTYPE ...>) is not accepted") from None
    except defusedxml.EntitiesForbidden:
        raise _bad("entity declarations are not accepted; nothing was expanded") from None
    except defusedxml.ExternalReferenceForbidden:
        raise _bad("external references are not accepted; nothing was fetched") from None
    except defusedxml.NotSupportedError:
        raise _bad("the document uses XML features that are not accepted") from None
    except ET.ParseError as exc:
        raise _bad(f"not well-formed XML ({exc})") from None
    except (ValueError, UnicodeError, LookupError) as exc:  # undecodable, or an encoding Python lacks
        raise _bad(f"not readable XML ({str(exc)[:100]})") from None


def _alphabet(raw: str | None, where: str) -> str:
    if raw is None:
        raise _bad(f"{where} names no alphabet")
    ours = ALPHABETS.get(raw.strip().lower())
    if ours is None:
        raise DomainError(
            ErrorCode.INVALID_PLS,
            f"PLS document refused: unknown alphabet {raw[:40]!r} in {where}; "
            f"accepted: {', '.join(sorted(ALPHABETS))}.",
            field="alphabet",
        )
    return ours


def parse(data: bytes, max_rules: int) -> Lexicon:
    """The rules of a PLS document (its first pronunciation per lexeme, one rule per grapheme).

    ``data`` is at most the plan's import bytes already (the caller read no more).
    """
    root = _parse_xml(data)
    if root.tag != _N + "lexicon":
        raise _bad(f"the root element must be <lexicon> in the namespace {PLS_NS}")
    if root.get("version") != "1.0":
        raise _bad('the lexicon must say version="1.0"')
    default_alphabet = root.get("alphabet")
    language = root.get("{http://www.w3.org/XML/1998/namespace}lang", "")[:35]
    rules: list[Rule] = []
    for n, lexeme in enumerate(root.iter(_N + "lexeme"), 1):
        graphemes = [g for g in lexeme.findall(_N + "grapheme")]
        if not graphemes:
            raise _bad(f"lexeme {n} has no <grapheme>")
        phoneme = lexeme.find(_N + "phoneme")
        alias = lexeme.find(_N + "alias")
        first = next((e for e in lexeme if e.tag in (_N + "phoneme", _N + "alias")), None)
        if first is None:
            raise _bad(f"lexeme {n} has neither <phoneme> nor <alias>")
        for g in graphemes:
            grapheme = (g.text or "").strip()
            case = (g.get(CASE_ATTRIBUTE) or "false").lower() == "true"
            if first is alias and alias is not None:
                rule = Rule(grapheme=grapheme, alias=(alias.text or "").strip(), case_sensitive=case)
            else:
                assert phoneme is not None
                alphabet = _alphabet(phoneme.get("alphabet") or default_alphabet, f"lexeme {n}")
                rule = Rule(
                    grapheme=grapheme,
                    phonemes=(phoneme.text or "").strip(),
                    alphabet=alphabet,
                    case_sensitive=case,
                )
            rules.append(rule)
            if len(rules) > max_rules:
                raise DomainError(
                    ErrorCode.DICTIONARY_LIMIT,
                    f"The document has more than {max_rules:,} rules, the plan's limit per dictionary.",
                    extra={"limit": "max_dictionary_rules", "max": max_rules},
                )
    if not rules:
        raise _bad("the lexicon has no lexemes")
    return Lexicon(language, rules)


def export(rules: list[Rule], language: str = "") -> bytes:
    """A PLS 1.0 document of ``rules`` (what :func:`parse` reads back to the same rules)."""
    ET.register_namespace("", PLS_NS)
    root = ET.Element(_N + "lexicon", {"version": "1.0", "alphabet": "ipa"})
    root.set("{http://www.w3.org/XML/1998/namespace}lang", language or "und")
    for rule in rules:
        lexeme = ET.SubElement(root, _N + "lexeme")
        grapheme = ET.SubElement(lexeme, _N + "grapheme")
        grapheme.text = rule.grapheme
        if rule.case_sensitive:
            grapheme.set(CASE_ATTRIBUTE, "true")
        if rule.alias is not None:
            ET.SubElement(lexeme, _N + "alias").text = rule.alias
        else:
            attrs = {"alphabet": EXPORT_ALPHABET[rule.alphabet or "ipa"]}
            ET.SubElement(lexeme, _N + "phoneme", attrs).text = rule.phonemes
    body: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return body
