"""What changes dictionaries, as named actions (each outer action one durable transaction).

Counts against the plan are exact: an action that adds a dictionary locks the
tenant row first, as submits do (speech's ledger), so parallel creates cannot
pass the limit, and a delete cannot slip between a submit's check of the
versions it pins and the job row that pins them.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet

from synth import lexicon
from synth.normalize import is_chinese_language
from webapp.dictionaries import pls
from webapp.dictionaries.models import Dictionary, DictionaryVersion, Rule
from webapp.errors import DomainError, ErrorCode
from webapp.tenants import locks
from webapp.tenants.models import Organization

MAX_PER_REQUEST = 3
# The job statuses that still need their pinned versions (speech's SynthesisJob.Status; this layer
# sits below speech and names them, as the reverse relation ``pinning_jobs`` does, without importing it).
UNFINISHED_JOB_STATUSES = ("queued", "running")


def rule_of(data: dict[str, Any], n: int) -> lexicon.Rule:
    """A checked synth rule from the API's fields (raises invalid_dictionary naming the rule)."""
    rule = lexicon.Rule(
        grapheme=data.get("grapheme") or "",
        alias=data.get("alias"),
        phonemes=data.get("phonemes"),
        alphabet=data.get("alphabet"),
        case_sensitive=bool(data.get("case_sensitive", False)),
    )
    check(rule, n)
    return rule


def check(rule: lexicon.Rule, n: int) -> None:
    try:
        lexicon.check_rule(rule)
        _check_expansion(rule)
    except lexicon.RuleError as exc:
        raise DomainError(
            ErrorCode.INVALID_DICTIONARY,
            f"Rule {n} ({rule.grapheme[:40]!r}): {exc}.",
            field=f"rules[{n - 1}]",
            extra={"rule": n},
        ) from None


def expansion_limit(chars: int) -> int:
    """The most characters ``chars`` characters of text may become through pronunciation dictionaries."""
    ratio = float(settings.TTS_DICTIONARY_MAX_EXPANSION)
    return max(int(ratio * chars), chars + int(settings.TTS_DICTIONARY_EXPANSION_SLACK))


def _check_expansion(rule: lexicon.Rule) -> None:
    """A rule whose replacement alone is past the expansion limit for its word is knowably too much."""
    replacement = rule.alias if rule.alias is not None else lexicon.annotation(rule)
    limit = expansion_limit(len(rule.grapheme))
    if len(replacement) > limit:
        raise lexicon.RuleError(
            f"its replacement is {len(replacement)} characters for a {len(rule.grapheme)}-character word; "
            f"at most {limit} (TTS_DICTIONARY_MAX_EXPANSION)"
        )


def rewritten_chars(text: str, pins: list[dict[str, Any]], language: str) -> int:
    """The length of ``text`` after the pinned versions' rules, as the worker will rewrite it for a
    voice speaking ``language`` (``synth.Synthesizer``: phoneme rules only where the language takes them)."""
    rewrite = lexicon.apply_lexicons(
        text,
        lexicons(pins),
        english=language.lower().startswith("en"),
        chinese=is_chinese_language(language.lower()),
    )
    return len(rewrite.text)


def _check_rules(rules: list[lexicon.Rule], organization: Organization) -> None:
    limit = organization.plan.max_dictionary_rules
    if len(rules) > limit:
        raise DomainError(
            ErrorCode.DICTIONARY_LIMIT,
            f"{len(rules):,} rules; the plan allows {limit:,} per dictionary version.",
            field="rules",
            extra={"limit": "max_dictionary_rules", "max": limit},
        )
    if not rules:
        raise DomainError(ErrorCode.INVALID_DICTIONARY, "A dictionary version needs at least one rule.")
    for n, rule in enumerate(rules, 1):
        check(rule, n)


def check_import_size(organization: Organization, size: int) -> None:
    """Before any parsing: a PLS body over the plan's import bytes is a 413 naming the limit."""
    limit = organization.plan.max_dictionary_import_bytes
    if size > limit:
        raise DomainError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"The PLS document is over the plan's import limit of {limit:,} bytes.",
            extra={"limit": "max_dictionary_import_bytes", "max": limit},
        )


def parse_import(organization: Organization, data: bytes) -> pls.Lexicon:
    check_import_size(organization, len(data))
    parsed = pls.parse(data, organization.plan.max_dictionary_rules)
    _check_rules(parsed.rules, organization)
    return parsed


def _write_version(dictionary: Dictionary, rules: list[lexicon.Rule], language: str) -> DictionaryVersion:
    dictionary.latest_version += 1
    dictionary.save(update_fields=["latest_version"])
    version = DictionaryVersion.objects.create(
        dictionary=dictionary, number=dictionary.latest_version, language=language, rule_count=len(rules)
    )
    Rule.objects.bulk_create(
        Rule(
            version=version,
            position=i,
            grapheme=r.grapheme,
            case_sensitive=r.case_sensitive,
            alias=r.alias or "",
            phonemes=r.phonemes or "",
            alphabet=r.alphabet or "",
        )
        for i, r in enumerate(rules)
    )
    return version


def _clear_default(organization: Organization, keep: uuid.UUID | None = None) -> None:
    rows = Dictionary.objects.filter(organization=organization, is_default=True)
    if keep is not None:
        rows = rows.exclude(pk=keep)
    rows.update(is_default=False)


def create_dictionary(
    organization: Organization,
    name: str,
    rules: list[lexicon.Rule],
    *,
    description: str = "",
    language: str = "",
    is_default: bool = False,
) -> tuple[Dictionary, DictionaryVersion]:
    """A new dictionary with its version 1 (dictionary_limit past the plan's count)."""
    with transaction.atomic(durable=True):
        org = locks.lock_tenant(organization.pk)
        limit = org.plan.max_dictionaries
        if Dictionary.objects.filter(organization=org).count() >= limit:
            raise DomainError(
                ErrorCode.DICTIONARY_LIMIT,
                f"This organization has {limit:,} dictionaries, the plan's limit; delete one first.",
                extra={"limit": "max_dictionaries", "max": limit},
            )
        _check_rules(rules, org)
        if Dictionary.objects.filter(organization=org, name=name).exists():
            raise DomainError(
                ErrorCode.INVALID_DICTIONARY, f"There is a dictionary named {name!r} already.", field="name"
            )
        if is_default:
            _clear_default(org)
        dictionary = Dictionary.objects.create(
            organization=org, name=name, description=description, is_default=is_default
        )
        version = _write_version(dictionary, rules, language)
    return dictionary, version


def add_version(
    organization: Organization, dictionary: Dictionary, rules: list[lexicon.Rule], *, language: str = ""
) -> DictionaryVersion:
    """The dictionary's next version; earlier ones stay as they were, the plan's newest count of them.

    Under the tenant's lock, which submits take to pin versions: a version pruned here is
    not being pinned meanwhile.
    """
    with transaction.atomic(durable=True):
        org = locks.lock_tenant(organization.pk)
        locked = Dictionary.objects.select_for_update().get(pk=dictionary.pk, organization=org)
        _check_rules(rules, org)
        version = _write_version(locked, rules, language)
        _prune_versions(locked, org.plan.max_dictionary_versions)
    return version


def _prune_versions(dictionary: Dictionary, keep: int) -> None:
    """Versions older than the newest ``keep`` go, except those a queued or running job pins.

    Each version holds its rules in full: without a bound, a key could grow the database
    by a version a request. Finished jobs keep their record of what they applied (pin_record).
    """
    oldest_kept = dictionary.latest_version - max(1, keep) + 1
    DictionaryVersion.objects.filter(dictionary=dictionary, number__lt=oldest_kept).exclude(
        pinning_jobs__status__in=UNFINISHED_JOB_STATUSES
    ).delete()


def update_dictionary(
    organization: Organization,
    dictionary: Dictionary,
    *,
    name: str | None = None,
    description: str | None = None,
    is_default: bool | None = None,
) -> Dictionary:
    """Name, description and the default flag (rules change only by a new version)."""
    with transaction.atomic(durable=True):
        org = locks.lock_tenant(organization.pk)
        locked = Dictionary.objects.select_for_update().get(pk=dictionary.pk, organization=org)
        if name is not None and name != locked.name:
            if Dictionary.objects.filter(organization=org, name=name).exists():
                raise DomainError(
                    ErrorCode.INVALID_DICTIONARY,
                    f"There is a dictionary named {name!r} already.",
                    field="name",
                )
            locked.name = name
        if description is not None:
            locked.description = description
        if is_default is not None:
            if is_default:
                _clear_default(org, keep=locked.pk)
            locked.is_default = is_default
        locked.save()
    return locked


def delete_dictionary(organization: Organization, dictionary: Dictionary) -> None:
    """Delete a dictionary and its versions; refused (409) while an unfinished job pins one of them.

    Refused rather than waited for: a delete answers at once, and the tenant retries once
    those jobs end (docs/api.md). Finished jobs keep their record of what was applied.
    """
    try:
        with transaction.atomic(durable=True):
            org = locks.lock_tenant(organization.pk)  # submits pin under the same lock
            locked = Dictionary.objects.select_for_update().filter(pk=dictionary.pk, organization=org).first()
            if locked is None:
                return
            pinning = (
                DictionaryVersion.objects.filter(
                    dictionary=locked, pinning_jobs__status__in=UNFINISHED_JOB_STATUSES
                )
                .values_list("pinning_jobs", flat=True)
                .distinct()
            )
            jobs = list(pinning[:6])
            if jobs:
                shown = ", ".join(str(j) for j in jobs[:5])
                raise DomainError(
                    ErrorCode.DICTIONARY_IN_USE,
                    f"Queued or running jobs pin a version of this dictionary ({shown}"
                    f"{', ...' if len(jobs) > 5 else ''}); delete it once they have finished.",
                    retry_after=30,
                )
            locked.delete()
    except IntegrityError as exc:  # a pin written in a race the lock did not cover
        raise DomainError(
            ErrorCode.DICTIONARY_IN_USE,
            "A job pinned this dictionary meanwhile; try again later.",
            retry_after=30,
        ) from exc


# --------------------------------------------------------------------- for submits and workers


def resolve(organization: Organization, refs: list[dict[str, Any]] | None) -> list[DictionaryVersion]:
    """The versions a request pins: those it names (at most 3, in its order), else the tenant default's latest.

    A ref without ``version`` pins the dictionary's latest version at this moment.
    """
    if refs is None:  # one statement per submit: the default's latest version, if there is one
        latest = (
            DictionaryVersion.objects.filter(
                dictionary__organization=organization,
                dictionary__is_default=True,
                number=F("dictionary__latest_version"),
            )
            .select_related("dictionary")
            .first()
        )
        return [latest] if latest is not None else []
    if len(refs) > MAX_PER_REQUEST:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            f"At most {MAX_PER_REQUEST} pronunciation dictionaries per request; got {len(refs)}.",
            field="pronunciation_dictionaries",
        )
    versions: list[DictionaryVersion] = []
    for n, ref in enumerate(refs):
        field = f"pronunciation_dictionaries[{n}]"
        try:
            pk = uuid.UUID(str(ref.get("id")))
        except ValueError:
            raise DomainError(ErrorCode.INVALID_ID, "Dictionary ids are UUIDs.", field=field) from None
        dictionary = Dictionary.objects.filter(pk=pk, organization=organization).first()
        if dictionary is None:
            raise DomainError(ErrorCode.NOT_FOUND, f"No dictionary {pk} in this organization.", field=field)
        number = ref.get("version") or dictionary.latest_version
        version = DictionaryVersion.objects.filter(dictionary=dictionary, number=number).first()
        if version is None:
            raise DomainError(
                ErrorCode.NOT_FOUND, f"Dictionary {pk} has no version {number}.", field=f"{field}.version"
            )
        if any(v.dictionary_id == version.dictionary_id for v in versions):
            raise DomainError(ErrorCode.INVALID_REQUEST, "A dictionary is named twice.", field=field)
        versions.append(version)
    return versions


def pin_record(versions: list[DictionaryVersion]) -> list[dict[str, Any]]:
    """What a job keeps of the versions it pins (readable after the dictionary is gone)."""
    return [
        {"id": str(v.dictionary_id), "version": v.number, "name": v.dictionary.name, "version_id": v.pk}
        for v in versions
    ]


def synth_rules(version: DictionaryVersion) -> list[lexicon.Rule]:
    return [
        lexicon.Rule(
            grapheme=r.grapheme,
            alias=None if r.alphabet else r.alias,
            phonemes=r.phonemes if r.alphabet else None,
            alphabet=r.alphabet or None,
            case_sensitive=r.case_sensitive,
        )
        for r in version.rules.all()
    ]


def lexicons(pins: list[dict[str, Any]]) -> list[lexicon.Lexicon]:
    """The synth lexicons of a job's pins, in its order (a version deleted meanwhile is skipped)."""
    ids = [p["version_id"] for p in pins]
    found: dict[int, DictionaryVersion] = {
        v.pk: v for v in DictionaryVersion.objects.filter(pk__in=ids).prefetch_related("rules")
    }
    return [
        lexicon.Lexicon(p["id"], p["version"], p["name"], tuple(synth_rules(found[p["version_id"]])))
        for p in pins
        if p["version_id"] in found
    ]


def pinned_versions(pins: list[dict[str, Any]]) -> list[DictionaryVersion]:
    """The versions of a job's pins that still exist, in its order (an operator's Retry pins them again)."""
    ids = [p["version_id"] for p in pins]
    found = {v.pk: v for v in DictionaryVersion.objects.filter(pk__in=ids).select_related("dictionary")}
    return [found[i] for i in ids if i in found]


def versions_of(dictionary: Dictionary) -> QuerySet[DictionaryVersion]:
    return DictionaryVersion.objects.filter(dictionary=dictionary).order_by("-number")


def require_present(versions: list[DictionaryVersion]) -> None:
    """At the submit's commit, under the tenant lock: every version it pins still exists."""
    present = set(
        DictionaryVersion.objects.filter(pk__in=[v.pk for v in versions]).values_list("pk", flat=True)
    )
    gone = [v for v in versions if v.pk not in present]
    if gone:
        raise DomainError(
            ErrorCode.NOT_FOUND,
            f"Dictionary {gone[0].dictionary_id} was deleted meanwhile.",
            field="pronunciation_dictionaries",
        )
