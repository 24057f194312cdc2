"""Request and response shapes of ``/api/v1/dictionaries`` (strict: unknown fields are a 400)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from synth.lexicon import ALPHABETS, MAX_ALIAS_CHARS, MAX_GRAPHEME_CHARS, MAX_PHONEMES_CHARS
from webapp.api_fields import StrictBooleanField, StrictCharField, StrictSerializer, iso
from webapp.dictionaries.models import Dictionary, DictionaryVersion, Rule


class RuleSerializer(StrictSerializer):
    grapheme = StrictCharField(max_length=MAX_GRAPHEME_CHARS, trim_whitespace=False)
    case_sensitive = StrictBooleanField(required=False, default=False)
    alias = StrictCharField(required=False, max_length=MAX_ALIAS_CHARS, trim_whitespace=False)
    phonemes = StrictCharField(required=False, max_length=MAX_PHONEMES_CHARS)
    alphabet = serializers.ChoiceField(choices=ALPHABETS, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("alias" in attrs) == ("phonemes" in attrs):
            raise serializers.ValidationError("A rule has either an alias or phonemes (with an alphabet).")
        if "phonemes" in attrs and "alphabet" not in attrs:
            raise serializers.ValidationError({"alphabet": ["Phonemes need their alphabet."]})
        if "alias" in attrs and "alphabet" in attrs:
            raise serializers.ValidationError({"alphabet": ["An alias has no alphabet."]})
        return attrs


class VersionCreateSerializer(StrictSerializer):
    language = StrictCharField(required=False, max_length=35, allow_blank=True)
    rules = RuleSerializer(many=True, help_text="In order: the first rule for a word wins.")


class DictionaryCreateSerializer(VersionCreateSerializer):
    name = StrictCharField(max_length=100)
    description = StrictCharField(required=False, max_length=500, allow_blank=True)
    is_default = StrictBooleanField(required=False, default=False)


class DictionaryUpdateSerializer(StrictSerializer):
    name = StrictCharField(required=False, max_length=100)
    description = StrictCharField(required=False, max_length=500, allow_blank=True)
    is_default = StrictBooleanField(required=False)


def rule_data(rule: Rule) -> dict[str, Any]:
    data: dict[str, Any] = {"grapheme": rule.grapheme, "case_sensitive": rule.case_sensitive}
    if rule.alphabet:
        data.update(phonemes=rule.phonemes, alphabet=rule.alphabet)
    else:
        data["alias"] = rule.alias
    return data


class DictionarySerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    description = serializers.CharField()
    is_default = serializers.BooleanField()
    latest_version = serializers.IntegerField()
    created_at = serializers.DateTimeField()

    def to_representation(self, instance: Any) -> dict[str, Any]:
        d: Dictionary = instance
        return {
            "id": str(d.id),
            "name": d.name,
            "description": d.description,
            "is_default": d.is_default,
            "latest_version": d.latest_version,
            "created_at": iso(d.created_at),
        }


class VersionSerializer(serializers.Serializer):
    dictionary_id = serializers.UUIDField()
    version = serializers.IntegerField()
    language = serializers.CharField()
    rule_count = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    rules = RuleSerializer(many=True, required=False, help_text="In the version's detail only.")

    def to_representation(self, instance: Any) -> dict[str, Any]:
        v: DictionaryVersion = instance
        data: dict[str, Any] = {
            "dictionary_id": str(v.dictionary_id),
            "version": v.number,
            "language": v.language,
            "rule_count": v.rule_count,
            "created_at": iso(v.created_at),
        }
        if self.context.get("with_rules"):
            data["rules"] = [rule_data(r) for r in v.rules.all()]
        return data


class NewDictionarySerializer(DictionarySerializer):
    """A created dictionary with its first version."""

    version = VersionSerializer()

    def to_representation(self, instance: Any) -> dict[str, Any]:
        dictionary, version = instance
        return {**super().to_representation(dictionary), "version": VersionSerializer(version).data}
