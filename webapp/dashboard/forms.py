"""Forms of the dashboard: they parse and validate input, nothing more."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from django import forms
from django.contrib.auth import password_validation
from django.contrib.auth.forms import AuthenticationForm
from django.utils import timezone

from webapp import outbound
from webapp.speech.models import Voice, VoiceConsent
from webapp.tenants.models import ApiKey, Membership
from webapp.webhooks.models import SUBSCRIBABLE


class SignUpForm(forms.Form):
    email = forms.EmailField(label="E-mail", max_length=150)
    organization = forms.CharField(
        label="Organisation name",
        max_length=200,
        required=False,
        help_text="Optional; you can rename it later.",
    )
    password = forms.CharField(
        label="Password", widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})
    )

    def clean_password(self) -> str:
        password: str = self.cleaned_data["password"]
        password_validation.validate_password(password)
        return password


class LoginForm(AuthenticationForm):
    """Django's form, with the user name shown as what it is: the e-mail address."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["username"].label = "E-mail"
        self.fields["username"].widget.attrs["autocomplete"] = "email"


def _code_field(label: str = "Code from your authenticator app (or a recovery code)") -> forms.CharField:
    return forms.CharField(
        label=label,
        max_length=20,
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric"}),
    )


def _current_password_field() -> forms.CharField:
    return forms.CharField(
        label="Your current password",
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}),
    )


class CodeForm(forms.Form):
    code = _code_field()


class ReauthForm(forms.Form):
    """The password again, and a current code while two-step sign-in is on: asked before any
    change to how the account signs in (the view checks them: ``accounts.reauthenticate``)."""

    password = _current_password_field()
    code = _code_field()

    def __init__(self, *args: Any, with_code: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not with_code:
            del self.fields["code"]


class EmailChangeForm(ReauthForm):
    email = forms.EmailField(label="New e-mail", max_length=150)
    field_order = ["email", "password", "code"]


class EnrolForm(forms.Form):
    """Turning two-step sign-in on: a code from the new app entry, and the password."""

    code = _code_field("Code the app shows")
    password = _current_password_field()


class JoinForm(forms.Form):
    """The password an invited person chooses for their new account."""

    new_password1 = forms.CharField(
        label="Choose a password", widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})
    )
    new_password2 = forms.CharField(
        label="The same password again", widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})
    )

    def clean_new_password1(self) -> str:
        password: str = self.cleaned_data["new_password1"]
        password_validation.validate_password(password)
        return password

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("new_password1") and data.get("new_password1") != data.get("new_password2"):
            self.add_error("new_password2", "The two passwords differ.")
        return data


class KeyForm(forms.Form):
    name = forms.CharField(label="Name", max_length=100)
    scopes = forms.MultipleChoiceField(
        label="Scopes",
        choices=ApiKey.Scope.choices,
        initial=[ApiKey.Scope.SPEECH_WRITE, ApiKey.Scope.SPEECH_READ],
        widget=forms.CheckboxSelectMultiple,
    )
    expires_in_days = forms.IntegerField(
        label="Expires after (days)",
        required=False,
        min_value=1,
        max_value=3650,
        help_text="Leave empty for a key that does not expire.",
    )
    monthly_characters = forms.IntegerField(
        label="Monthly characters (cap)",
        required=False,
        min_value=1,
        max_value=10**15,
        help_text="Leave empty for no cap of its own; past a cap its requests are refused until next month.",
    )

    def expires_at(self) -> dt.datetime | None:
        days = self.cleaned_data.get("expires_in_days")
        return timezone.now() + dt.timedelta(days=days) if days else None


# Choices for how long a rotated-out secret keeps working.
OVERLAPS = [(0, "Stop the old secret now"), (3600, "1 hour"), (86400, "1 day"), (7 * 86400, "7 days")]


class RotateForm(forms.Form):
    overlap = forms.TypedChoiceField(
        label="Old secret keeps working", choices=OVERLAPS, coerce=int, initial=3600
    )


def role_choices() -> list[tuple[str, str]]:
    return [(value, label.capitalize()) for value, label in Membership.Role.choices]


class InviteForm(forms.Form):
    email = forms.EmailField(label="E-mail", max_length=150)
    role = forms.ChoiceField(label="Role", choices=role_choices, initial=Membership.Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(label="Role", choices=role_choices)


SOURCES = [("", "Any source"), ("api", "API"), ("openai", "OpenAI endpoint"), ("dashboard", "Dashboard")]


class HistoryFilterForm(forms.Form):
    q = forms.CharField(label="Search in the text", required=False, max_length=200)
    status = forms.ChoiceField(label="Status", required=False)
    voice = forms.CharField(label="Voice", required=False, max_length=200)
    source = forms.ChoiceField(label="Source", required=False, choices=SOURCES)
    created_from = forms.DateField(
        label="From (UTC)", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    created_to = forms.DateField(
        label="To (UTC)", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )

    def __init__(self, *args: Any, statuses: list[str], voices: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        status = self.fields["status"]
        assert isinstance(status, forms.ChoiceField)
        status.choices = [("", "Any status")] + [(s, s.capitalize()) for s in statuses]
        self.fields["voice"].widget = forms.Select(choices=[("", "Any voice")] + [(v, v) for v in voices])

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("created_from"), data.get("created_to")
        if start and end and start > end:
            self.add_error("created_to", "The last day comes before the first.")
        return data


# The words the uploader confirms; the voice stores who confirmed them and when.
CONSENT_TEXT = (
    "I confirm that the person speaking in this recording gave me permission to use their voice here."
)


class VoiceUploadForm(forms.Form):
    """The fields of ``POST /api/v1/voices``; the upload service checks the audio itself.

    ``consents``: the tenant's recorded consents a new voice may name (``recorded_consent``,
    which makes it cloneable); without one the uploader's checkbox (``consent``) is needed.
    """

    name = forms.CharField(label="Name", max_length=Voice.MAX_NAME_CHARS)
    audio = forms.FileField(
        label="Recording",
        help_text="3 to 15 seconds of one person speaking, 16 kHz or better (WAV, FLAC, Ogg, MP3, M4A, WebM); "
        "or record it below.",
        widget=forms.ClearableFileInput(attrs={"accept": "audio/*"}),
    )
    transcript = forms.CharField(
        label="What the recording says (optional)",
        required=False,
        max_length=Voice.MAX_TRANSCRIPT_CHARS,
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    recorded_consent = forms.ChoiceField(
        label="Recorded consent of the speaker",
        required=False,
        help_text="A consent recorded on the Consents page: the voice may then be cloned.",
    )
    consent = forms.BooleanField(label=CONSENT_TEXT, required=False)

    def __init__(self, *args: Any, consents: list[VoiceConsent] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [("", "None: I confirm the speaker's permission below (the voice is not cloned)")]
        choices += [
            (c.consent_id, f"{c.name} ({c.language}, {c.created_at:%Y-%m-%d})") for c in consents or []
        ]
        self.consent_choices = choices[1:]  # the recorded ones, for the page's other consent forms
        cast(forms.ChoiceField, self.fields["recorded_consent"]).choices = choices

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        if data is not None and not data.get("recorded_consent") and not data.get("consent"):
            self.add_error("consent", "Confirm that you have the speaker's permission to upload their voice.")
        return data


# ----------------------------------------------------------------- pronunciation dictionaries

RULES_HELP = (
    "One rule per line: “word = what to say” (an alias), or “word = [arpabet] HH AH0 L OW1” "
    "(phonemes in arpabet, ipa or pinyin); “==” instead of “=” matches the word's case exactly. "
    "Lines starting with # are skipped; the first rule for a word wins."
)
RULE_ALPHABETS = ("arpabet", "ipa", "pinyin")


def parse_rule_lines(text: str) -> list[dict[str, Any]]:
    """The rules of the textarea as the API's rule fields (the services check each one)."""
    rules: list[dict[str, Any]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exact = "==" in line
        grapheme, sep, said = line.partition("==" if exact else "=")
        grapheme, said = grapheme.strip(), said.strip()
        if not sep or not grapheme or not said:
            raise forms.ValidationError(f"Line {n}: write “word = what to say”.")
        rule: dict[str, Any] = {"grapheme": grapheme, "case_sensitive": exact}
        if said.startswith("["):
            alphabet, closed, phonemes = said[1:].partition("]")
            if not closed or alphabet.strip().lower() not in RULE_ALPHABETS or not phonemes.strip():
                raise forms.ValidationError(
                    f"Line {n}: phonemes are written “[arpabet] HH AH0”, “[ipa] …” or “[pinyin] …”."
                )
            rule.update(alphabet=alphabet.strip().lower(), phonemes=phonemes.strip())
        else:
            rule["alias"] = said
        rules.append(rule)
    return rules


def rule_lines(rules: Any) -> str:
    """A version's rules written back in the textarea's form (to start the next version from)."""
    lines = []
    for r in rules:
        sep = "==" if r.case_sensitive else "="
        said = f"[{r.alphabet}] {r.phonemes}" if r.alphabet else r.alias
        lines.append(f"{r.grapheme} {sep} {said}")
    return "\n".join(lines)


class VersionForm(forms.Form):
    """A version's rules: typed in, or a PLS 1.0 document uploaded (the upload wins)."""

    rules = forms.CharField(
        label="Rules",
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
        help_text=RULES_HELP,
    )
    pls_file = forms.FileField(
        label="Or import a PLS file",
        required=False,
        help_text="A W3C Pronunciation Lexicon (.pls); its rules replace what is typed above.",
        widget=forms.ClearableFileInput(attrs={"accept": ".pls,.xml,application/pls+xml"}),
    )

    def clean_rules(self) -> list[dict[str, Any]]:
        return parse_rule_lines(self.cleaned_data.get("rules") or "")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors and not data.get("pls_file") and not data.get("rules"):
            self.add_error("rules", "Enter at least one rule, or choose a PLS file.")
        return data


class DictionaryForm(VersionForm):
    name = forms.CharField(label="Name", max_length=100)
    description = forms.CharField(label="Description", max_length=500, required=False)
    is_default = forms.BooleanField(
        label="Use for every request that names no dictionary (the default)", required=False
    )
    field_order = ["name", "description", "rules", "pls_file", "is_default"]


# ----------------------------------------------------------------- webhooks


class WebhookForm(forms.Form):
    url = forms.CharField(
        label="URL",
        max_length=2000,
        widget=forms.TextInput(
            attrs={"inputmode": "url", "autocomplete": "url", "placeholder": "https://example.com/hooks/tts"}
        ),
        help_text="An https URL on a public address; events are POSTed to it, signed.",
    )
    events = forms.MultipleChoiceField(
        label="Events", choices=[(e, e) for e in SUBSCRIBABLE], widget=forms.CheckboxSelectMultiple
    )
    description = forms.CharField(label="Description", max_length=500, required=False)
    enabled = forms.BooleanField(label="Enabled", required=False, initial=True)

    def clean_url(self) -> str:
        url: str = self.cleaned_data["url"].strip()
        try:
            outbound.check_literal(url)
        except outbound.Refused as exc:
            raise forms.ValidationError(f"Not a webhook URL: {exc}.") from None
        return url

    def clean_events(self) -> list[str]:
        return sorted(set(self.cleaned_data["events"]))


class WebhookRotateForm(forms.Form):
    overlap = forms.TypedChoiceField(
        label="Old secret keeps signing", choices=OVERLAPS, coerce=int, initial=3600
    )
