"""``/api/v1/dictionaries``: CRUD, immutable versions, plan limits, PLS import/export and its attacks."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import problem

pytestmark = pytest.mark.usefixtures("builtin_voices")

PLS = "application/pls+xml"
NS = "http://www.w3.org/2005/01/pronunciation-lexicon"
RULES: list[dict[str, Any]] = [
    {"grapheme": "minute", "phonemes": "M AY0 N UW1 T", "alphabet": "arpabet"},
    {"grapheme": "NASA", "alias": "national space agency", "case_sensitive": True},
    {"grapheme": "tomato", "phonemes": "təˈmɑːtoʊ", "alphabet": "ipa"},
]


def _pls(body: str, alphabet: str = "ipa") -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<lexicon version="1.0" xmlns="{NS}" '
        f'alphabet="{alphabet}" xml:lang="en-US">{body}</lexicon>'
    ).encode()


def post_pls(tenant: Any, path: str, data: bytes) -> Any:
    return tenant.client.client.post(
        path, data, content_type=PLS, HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}"
    )


def test_it_creates_lists_gets_and_deletes_a_dictionary(make_tenant: Any) -> None:
    tenant = make_tenant()
    created = tenant.client.post("/api/v1/dictionaries", {"name": "brands", "rules": RULES})
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["latest_version"] == 1 and body["version"]["rule_count"] == 3
    assert created["Location"] == f"/api/v1/dictionaries/{body['id']}"
    listed = tenant.client.get("/api/v1/dictionaries").json()["results"]
    assert [d["name"] for d in listed] == ["brands"]
    version = tenant.client.get(f"/api/v1/dictionaries/{body['id']}/versions/1").json()
    assert version["rules"] == [
        {"case_sensitive": False, **RULES[0]},
        RULES[1],
        {"case_sensitive": False, **RULES[2]},
    ]
    other = make_tenant()
    assert other.client.get(f"/api/v1/dictionaries/{body['id']}").status_code == 404
    assert other.client.delete(f"/api/v1/dictionaries/{body['id']}").status_code == 404
    assert tenant.client.delete(f"/api/v1/dictionaries/{body['id']}").status_code == 204
    assert tenant.client.get(f"/api/v1/dictionaries/{body['id']}").status_code == 404


def test_it_keeps_old_versions_readable_when_a_new_one_is_made(make_tenant: Any) -> None:
    tenant = make_tenant()
    d = tenant.client.post("/api/v1/dictionaries", {"name": "v", "rules": RULES[:1]}).json()
    made = tenant.client.post(f"/api/v1/dictionaries/{d['id']}/versions", {"rules": RULES[1:]})
    assert made.status_code == 201 and made.json()["version"] == 2
    versions = tenant.client.get(f"/api/v1/dictionaries/{d['id']}/versions").json()["results"]
    assert [v["version"] for v in versions] == [2, 1]
    old = tenant.client.get(f"/api/v1/dictionaries/{d['id']}/versions/1").json()
    assert [r["grapheme"] for r in old["rules"]] == ["minute"]
    assert tenant.client.get(f"/api/v1/dictionaries/{d['id']}").json()["latest_version"] == 2


def test_it_refuses_rules_that_cannot_be_spoken(make_tenant: Any) -> None:
    tenant = make_tenant()
    for rule, field in (
        ({"grapheme": "x", "phonemes": "QQ ZZ", "alphabet": "arpabet"}, "rules[0]"),
        ({"grapheme": "x", "phonemes": "ʘ", "alphabet": "ipa"}, "rules[0]"),
        ({"grapheme": "x", "alias": "a [[b]]"}, "rules[0]"),
    ):
        answer = tenant.client.post("/api/v1/dictionaries", {"name": "bad", "rules": [rule]})
        assert answer.status_code == 400, answer.content
        assert problem(answer)["code"] == "invalid_dictionary" and problem(answer)["field"] == field
    both = tenant.client.post(
        "/api/v1/dictionaries", {"name": "bad", "rules": [{"grapheme": "x", "alias": "y", "phonemes": "Y"}]}
    )
    assert both.status_code == 400


def test_it_names_the_plan_limit_it_hits(make_tenant: Any) -> None:
    tenant = make_tenant(max_dictionaries=1, max_dictionary_rules=2, max_dictionary_import_bytes=400)
    assert tenant.client.post("/api/v1/dictionaries", {"name": "a", "rules": RULES[:1]}).status_code == 201
    second = tenant.client.post("/api/v1/dictionaries", {"name": "b", "rules": RULES[:1]})
    assert second.status_code == 422 and problem(second)["limit"] == "max_dictionaries"
    d = tenant.client.get("/api/v1/dictionaries").json()["results"][0]
    many = tenant.client.post(f"/api/v1/dictionaries/{d['id']}/versions", {"rules": RULES})
    assert many.status_code == 422 and problem(many)["limit"] == "max_dictionary_rules"
    big = _pls("<lexeme><grapheme>a</grapheme><alias>b</alias></lexeme>" * 20)
    assert len(big) > 400
    answer = post_pls(tenant, f"/api/v1/dictionaries/{d['id']}/versions", big)
    assert answer.status_code == 413 and problem(answer)["limit"] == "max_dictionary_import_bytes"


def test_it_imports_and_exports_pls(make_tenant: Any) -> None:
    tenant = make_tenant()
    doc = _pls(
        "<lexeme><grapheme>tomato</grapheme><phoneme>təˈmɑːtoʊ</phoneme></lexeme>"
        '<lexeme><grapheme>minute</grapheme><phoneme alphabet="x-arpabet">M AY0 N UW1 T</phoneme></lexeme>'
        "<lexeme><grapheme>W3C</grapheme><grapheme>w3c</grapheme><alias>World Wide Web Consortium</alias></lexeme>"
    )
    made = post_pls(tenant, "/api/v1/dictionaries?name=imported&is_default=true", doc)
    assert made.status_code == 201, made.content
    body = made.json()
    assert (
        body["is_default"] and body["version"]["rule_count"] == 4 and body["version"]["language"] == "en-US"
    )
    exported = tenant.client.get(f"/api/v1/dictionaries/{body['id']}/versions/1", HTTP_ACCEPT=PLS)
    assert exported.status_code == 200 and exported["Content-Type"].startswith(PLS)
    again = post_pls(tenant, f"/api/v1/dictionaries/{body['id']}/versions", exported.content)
    assert again.status_code == 201
    first = tenant.client.get(f"/api/v1/dictionaries/{body['id']}/versions/1").json()["rules"]
    assert again.json()["rules"] == first


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lexicon [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa">
<lexeme><grapheme>a</grapheme><alias>&lol4;</alias></lexeme></lexicon>"""


@pytest.mark.parametrize(
    ("name", "document", "words"),
    [
        ("billion laughs", BILLION_LAUGHS, "entity declarations"),
        (
            "external entity",
            b'<?xml version="1.0"?><!DOCTYPE lexicon [<!ENTITY x SYSTEM "http://127.0.0.1:9/secret">]>'
            b'<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa">'
            b"<lexeme><grapheme>a</grapheme><alias>&x;</alias></lexeme></lexicon>",
            "nothing was expanded or fetched",
        ),
        (
            "external DTD",
            b'<?xml version="1.0"?><!DOCTYPE lexicon SYSTEM "http://127.0.0.1:9/pls.dtd">'
            b'<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"/>',
            "external DTD",
        ),
        ("DTD", b'<?xml version="1.0"?><!DOCTYPE lexicon><lexicon/>', "DTD"),
        (
            "unknown alphabet",
            _pls("<lexeme><grapheme>a</grapheme><phoneme>a</phoneme></lexeme>", "x-klingon"),
            "x-klingon",
        ),
        ("not XML", b"<lexicon", "not well-formed"),
        ("unknown encoding", b'<?xml version="1.0" encoding="klingon"?><lexicon/>', "not readable"),
        ("not PLS", b"<speak/>", "root element"),
    ],
)
def test_it_refuses_a_hostile_or_broken_pls_document_with_a_4xx(
    make_tenant: Any, name: str, document: bytes, words: str
) -> None:
    tenant = make_tenant()
    answer = post_pls(tenant, "/api/v1/dictionaries?name=x", document)
    assert answer.status_code == 400, (name, answer.content)
    body = problem(answer)
    assert body["code"] == "invalid_pls" and words in body["detail"], body


def test_it_refuses_an_oversized_document_before_parsing(make_tenant: Any) -> None:
    tenant = make_tenant(max_dictionary_import_bytes=1024)
    answer = post_pls(tenant, "/api/v1/dictionaries?name=x", b"<" * 10_000)
    assert answer.status_code == 413
    assert problem(answer)["limit"] == "max_dictionary_import_bytes"


def test_it_needs_voices_write_to_change_dictionaries(make_tenant: Any) -> None:
    tenant = make_tenant(scopes=["speech:read", "speech:write"])
    assert tenant.client.post("/api/v1/dictionaries", {"name": "a", "rules": RULES}).status_code == 403
    assert tenant.client.get("/api/v1/dictionaries").status_code == 200


def test_it_moves_the_default_to_the_dictionary_last_made_default(make_tenant: Any) -> None:
    tenant = make_tenant()
    a = tenant.client.post("/api/v1/dictionaries", {"name": "a", "rules": RULES, "is_default": True}).json()
    b = tenant.client.post("/api/v1/dictionaries", {"name": "b", "rules": RULES}).json()
    patched = tenant.client.client.patch(
        f"/api/v1/dictionaries/{b['id']}",
        '{"is_default": true}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}",
    )
    assert patched.status_code == 200 and patched.json()["is_default"]
    assert not tenant.client.get(f"/api/v1/dictionaries/{a['id']}").json()["is_default"]


# --------------------------------------------------------------------- submits


SPEAK = {"text": "Wait a minute.", "voice": "espeak-en-us"}


@pytest.mark.usefixtures("queued_only")
def test_a_job_pins_the_versions_it_names_and_their_dictionary_cannot_go_while_it_is_queued(
    make_tenant: Any,
) -> None:
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant()
    d = tenant.client.post("/api/v1/dictionaries", {"name": "d", "rules": RULES}).json()
    ref = [{"id": d["id"], "version": 1}]
    job = tenant.client.post("/api/v1/speech", {**SPEAK, "pronunciation_dictionaries": ref})
    assert job.status_code == 202, job.content
    tenant.client.post(f"/api/v1/dictionaries/{d['id']}/versions", {"rules": RULES[:1]})
    shown = tenant.client.get(f"/api/v1/speech/{job.json()['id']}").json()["pronunciation_dictionaries"]
    assert shown == [{"id": d["id"], "version": 1, "name": "d"}]
    refused = tenant.client.delete(f"/api/v1/dictionaries/{d['id']}")
    assert refused.status_code == 409 and problem(refused)["code"] == "dictionary_in_use"
    assert job.json()["id"] in problem(refused)["detail"]
    SynthesisJob.objects.filter(pk=job.json()["id"]).update(status="succeeded")
    assert tenant.client.delete(f"/api/v1/dictionaries/{d['id']}").status_code == 204
    after = tenant.client.get(f"/api/v1/speech/{job.json()['id']}").json()["pronunciation_dictionaries"]
    assert after == shown  # the record outlives the dictionary


@pytest.mark.usefixtures("queued_only")
def test_it_keeps_the_plans_newest_versions_and_any_a_queued_job_pins(make_tenant: Any) -> None:
    from webapp.dictionaries.models import DictionaryVersion, Rule
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant(max_dictionary_versions=2)
    d = tenant.client.post("/api/v1/dictionaries", {"name": "d", "rules": RULES}).json()
    versions = f"/api/v1/dictionaries/{d['id']}/versions"
    ref = [{"id": d["id"], "version": 1}]
    job = tenant.client.post("/api/v1/speech", {**SPEAK, "pronunciation_dictionaries": ref})
    assert job.status_code == 202, job.content
    for _ in range(3):
        assert tenant.client.post(versions, {"rules": RULES[:1]}).status_code == 201

    def listed() -> list[int]:
        return [v["version"] for v in tenant.client.get(versions).json()["results"]]

    assert listed() == [4, 3, 1]  # the newest two, and the one the queued job pins
    assert tenant.client.get(f"{versions}/2").status_code == 404
    SynthesisJob.objects.filter(pk=job.json()["id"]).update(status="succeeded")
    assert tenant.client.post(versions, {"rules": RULES[:1]}).status_code == 201
    assert listed() == [5, 4]
    # Gone with their rules, not hidden: the rows are bounded.
    assert DictionaryVersion.objects.filter(dictionary_id=d["id"]).count() == 2
    assert Rule.objects.filter(version__dictionary_id=d["id"]).count() == 2
    shown = tenant.client.get(f"/api/v1/speech/{job.json()['id']}").json()["pronunciation_dictionaries"]
    assert shown == [{"id": d["id"], "version": 1, "name": "d"}]  # the finished job's record stays


@pytest.mark.usefixtures("queued_only")
def test_the_tenant_default_applies_when_a_request_names_none_also_on_the_openai_path(
    make_tenant: Any,
) -> None:
    from webapp.speech import submission

    tenant = make_tenant()
    d = tenant.client.post("/api/v1/dictionaries", {"name": "d", "rules": RULES, "is_default": True}).json()
    tenant.client.post(f"/api/v1/dictionaries/{d['id']}/versions", {"rules": RULES[:2]})
    job = tenant.client.post("/api/v1/speech", SPEAK).json()
    assert [(p["id"], p["version"]) for p in job["pronunciation_dictionaries"]] == [(d["id"], 2)]
    none = tenant.client.post("/api/v1/speech", {**SPEAK, "pronunciation_dictionaries": []}).json()
    assert none["pronunciation_dictionaries"] == []
    openai = submission.job_request(tenant.org, {"text": "Hi.", "voice": "espeak-en-us"}, "openai")
    assert [v.number for v in openai.dictionaries.versions] == [2]


@pytest.mark.usefixtures("queued_only")
def test_a_request_names_at_most_three_dictionaries_of_its_own_tenant(make_tenant: Any) -> None:
    tenant, other = make_tenant(), make_tenant()
    ids = [
        tenant.client.post("/api/v1/dictionaries", {"name": f"d{i}", "rules": RULES}).json()["id"]
        for i in range(4)
    ]
    four = tenant.client.post(
        "/api/v1/speech", {**SPEAK, "pronunciation_dictionaries": [{"id": i} for i in ids]}
    )
    assert four.status_code == 400 and problem(four)["field"] == "pronunciation_dictionaries"
    theirs = other.client.post("/api/v1/speech", {**SPEAK, "pronunciation_dictionaries": [{"id": ids[0]}]})
    assert theirs.status_code == 404
    missing = tenant.client.post(
        "/api/v1/speech", {**SPEAK, "pronunciation_dictionaries": [{"id": ids[0], "version": 9}]}
    )
    assert missing.status_code == 404 and "version 9" in problem(missing)["detail"]


# --------------------------------------------------------------------- through the worker


def _heard(path: str) -> list[str]:
    import numpy as np
    import soundfile
    from pocketsphinx import Decoder

    audio, rate = soundfile.read(path, dtype="int16")
    assert rate == 16000
    decoder = Decoder(samprate=16000, logfn="/dev/null")
    words = "i | like | the | tomato | window | banana | yellow | music | hello | computer"
    decoder.add_jsgf_string("g", f"#JSGF V1.0; grammar g; public <s> = <w>+ ; <w> = {words} ;")
    decoder.activate_search("g")
    decoder.start_utt()
    decoder.process_raw(np.ascontiguousarray(audio).tobytes(), full_utt=True)
    decoder.end_utt()
    return decoder.hyp().hypstr.split() if decoder.hyp() else []


def test_the_worker_speaks_the_pinned_version_and_a_new_version_never_gets_stale_audio(
    live_tenant: Any,
) -> None:
    from django.conf import settings

    from tests.integration.api.conftest import wait_finished
    from webapp.speech.models import SynthesisJob

    tenant = live_tenant()
    body = {"text": "I like the tomato.", "voice": "espeak-en-us", "format": "wav", "sample_rate": 16000}
    rules = [
        {"grapheme": "tomato", "alias": "window"},
        {"grapheme": "like", "phonemes": "hao3", "alphabet": "pinyin"},
    ]
    d = tenant.client.post("/api/v1/dictionaries", {"name": "d", "rules": rules}).json()
    tenant.client.post(
        f"/api/v1/dictionaries/{d['id']}/versions", {"rules": [{"grapheme": "tomato", "alias": "banana"}]}
    )
    heard = {}
    for name, refs in (
        ("none", []),
        ("v1", [{"id": d["id"], "version": 1}]),
        ("v2", [{"id": d["id"], "version": 2}]),
    ):
        created = tenant.client.post("/api/v1/speech", {**body, "pronunciation_dictionaries": refs})
        assert created.status_code == 202, created.content
        done = wait_finished(tenant.client, created.json()["id"], timeout=60)
        assert done["status"] == "succeeded", done
        job = SynthesisJob.objects.get(pk=done["id"])
        heard[name] = _heard(str(settings.MEDIA_ROOT / job.audio_path))
        if name == "v1":
            assert done["pronunciation_dictionaries"] == [
                {"id": d["id"], "version": 1, "name": "d", "rules_applied": 1, "replacements": 1}
            ]
            assert any("pinyin needs a Chinese voice" in n for n in job.applied_instructions["not_applied"])
    assert "window" not in heard["none"] and "banana" not in heard["none"], heard
    assert "window" in heard["v1"] and "banana" in heard["v2"], heard


@pytest.mark.usefixtures("queued_only")
def test_an_operators_retry_pins_the_failed_jobs_versions_again(make_tenant: Any) -> None:
    from webapp.speech import operator
    from webapp.speech.models import SynthesisJob

    tenant = make_tenant()
    d = tenant.client.post("/api/v1/dictionaries", {"name": "d", "rules": RULES}).json()
    job_id = tenant.client.post(
        "/api/v1/speech", SPEAK | {"pronunciation_dictionaries": [{"id": d["id"]}]}
    ).json()["id"]
    SynthesisJob.objects.filter(pk=job_id).update(status="failed")
    again = operator.retry_job(SynthesisJob.objects.get(pk=job_id))
    assert [(p["id"], p["version"]) for p in again.dictionaries] == [(d["id"], 1)]
    assert again.pinned_dictionary_versions.count() == 1


# --------------------------------------------------------------------- amplification (issue 48, item 2)

# A 50-character alias for a 4-character word: within the per-rule limit (4 x 4, or 4 + 50).
ALIAS = "the national aeronautics and space administration."
AMPLIFIER = {"grapheme": "NASA", "alias": ALIAS, "case_sensitive": True}


def test_a_rule_whose_replacement_dwarfs_its_word_is_refused_when_made(make_tenant: Any) -> None:
    tenant = make_tenant()
    for rule in ({"grapheme": "a", "alias": "x" * 60}, {"grapheme": "NASA", "alias": "y " * 40}):
        answer = tenant.client.post("/api/v1/dictionaries", {"name": "amp", "rules": [rule]})
        assert answer.status_code == 400, answer.content
        assert problem(answer)["code"] == "invalid_dictionary" and problem(answer)["field"] == "rules[0]"
        assert "TTS_DICTIONARY_MAX_EXPANSION" in problem(answer)["detail"]
    assert tenant.client.post("/api/v1/dictionaries", {"name": "ok", "rules": [AMPLIFIER]}).status_code == 201


@pytest.mark.usefixtures("queued_only")
def test_a_submit_whose_dictionaries_multiply_its_text_is_refused_and_writes_nothing(
    make_tenant: Any,
) -> None:
    from webapp.speech.models import SynthesisJob, UsageEvent

    tenant = make_tenant()
    made = {"name": "amp", "rules": [AMPLIFIER], "is_default": True}
    d = tenant.client.post("/api/v1/dictionaries", made).json()
    ref = [{"id": d["id"]}]
    many = {"text": "NASA " * 200, "voice": "espeak-en-us", "pronunciation_dictionaries": ref}
    refused = tenant.client.post("/api/v1/speech", many)
    assert refused.status_code == 413, refused.content
    assert problem(refused)["code"] == "request_too_large"
    assert problem(refused)["field"] == "pronunciation_dictionaries"
    assert not SynthesisJob.objects.filter(organization=tenant.org).exists()
    assert not UsageEvent.objects.filter(organization=tenant.org).exists()
    # The OpenAI route pins the tenant's default: refused the same way.
    openai = tenant.client.post(
        "/v1/audio/speech", {"model": "tts-1", "input": "NASA " * 200, "voice": "alloy"}
    )
    assert openai.status_code == 413, openai.content


@pytest.mark.usefixtures("queued_only")
def test_a_job_s_time_limit_is_sized_on_the_text_its_dictionaries_make(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services.dispatch import job_time_limits

    tenant = make_tenant()
    d = tenant.client.post("/api/v1/dictionaries", {"name": "amp", "rules": [AMPLIFIER]}).json()
    text = "NASA and the moon. " * 10
    plain = tenant.client.post("/api/v1/speech", {"text": text, "voice": "espeak-en-us"}).json()
    ruled = tenant.client.post(
        "/api/v1/speech",
        {"text": text, "voice": "espeak-en-us", "pronunciation_dictionaries": [{"id": d["id"]}]},
    ).json()
    plain_job, ruled_job = SynthesisJob.objects.get(pk=plain["id"]), SynthesisJob.objects.get(pk=ruled["id"])
    assert plain_job.synth_chars is None
    assert ruled_job.text_chars == plain_job.text_chars  # the same charge ...
    assert ruled_job.synth_chars == plain_job.text_chars + 10 * (len(ALIAS) - len("NASA"))
    # ... and a longer time limit, for the longer text the engine gets.
    assert ruled_job.time_limit is not None and plain_job.time_limit is not None
    assert ruled_job.time_limit.total_seconds() == job_time_limits(ruled_job.synth_chars)[1]
    assert ruled_job.time_limit > plain_job.time_limit
