"""Dashboard forms. They only shape input; the services decide what is allowed."""

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.conf import settings

from core.choices import ALL_SCOPES, Jurisdiction, PlatformRole, Priority, Scope, TenantRole, TenantStatus
from core.models import SECRET_NAME


class TenantForm(forms.Form):
    slug = forms.SlugField(
        max_length=50, help_text="Lowercase letters, digits and dashes; cannot change later."
    )
    name = forms.CharField(max_length=200)
    residency = forms.MultipleChoiceField(
        choices=Jurisdiction.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text="Where this tenant's data may be processed and stored.",
    )
    status = forms.ChoiceField(choices=TenantStatus.choices, initial=TenantStatus.ACTIVE)
    home_region = forms.CharField(max_length=64, required=False)
    max_gpus = forms.IntegerField(min_value=0, required=False, label="GPU quota")
    monthly_budget = forms.DecimalField(max_digits=14, decimal_places=2, min_value=0, required=False)
    budget_currency = forms.RegexField(
        r"^[A-Z]{3}$",
        initial=lambda: settings.BILLING_CURRENCY,
        help_text="Budgets are kept in the cost currency.",
    )


class TenantEditForm(TenantForm):
    slug = None  # type: ignore[assignment]
    revision = forms.IntegerField(widget=forms.HiddenInput)


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=TenantRole.choices)


class ServiceAccountForm(forms.Form):
    name = forms.SlugField(max_length=50)
    role = forms.ChoiceField(choices=TenantRole.choices)
    description = forms.CharField(max_length=500, required=False)


class SecretForm(forms.Form):
    name = forms.RegexField(
        f"^{SECRET_NAME}$", max_length=63, widget=forms.TextInput(attrs={"autocomplete": "off"})
    )
    # Never rendered back (an error shows an empty field), and never filled in by the browser with the
    # user's own password ("new-password": the password manager does not offer the login).
    value = forms.CharField(
        max_length=4096,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )


class UserForm(forms.Form):
    username = forms.RegexField(r"^[\w.@+-]{1,150}$", max_length=150)
    email = forms.EmailField(required=False)
    password = forms.CharField(widget=forms.PasswordInput, required=False, help_text="Leave empty for none.")
    platform_role = forms.ChoiceField(choices=PlatformRole.choices, required=False)


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    owner = forms.ChoiceField(help_text="Yourself, or a service account you manage.")
    scopes = forms.MultipleChoiceField(
        choices=[
            (scope.value, f"{scope.value} — {scope.label}") for scope in Scope if scope.value in ALL_SCOPES
        ],
        widget=forms.CheckboxSelectMultiple,
    )
    expires_in_days = forms.IntegerField(min_value=1, max_value=3650, required=False, initial=90)
    priority = forms.ChoiceField(
        choices=Priority.choices,
        initial=Priority.INTERACTIVE,
        required=False,
        help_text="For models:invoke tokens: batch requests are shed first when a model is saturated.",
    )
    tenant = forms.ChoiceField(
        required=False,
        help_text="The one tenant the token acts in and is served for at the gateway (needed for "
        "models:invoke when you belong to several; a service account's token is bound to its tenant).",
    )

    def __init__(
        self,
        *args: object,
        owners: list[tuple[str, str]],
        tenants: list[tuple[str, str]] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["owner"].choices = owners  # type: ignore[attr-defined]
        self.fields["tenant"].choices = [("", "— unbound —"), *(tenants or [])]  # type: ignore[attr-defined]


class UTCDateTimeField(forms.DateTimeField):
    """A time the database can compare: converted to UTC (PostgreSQL refuses offsets past ±15:59)."""

    def to_python(self, value: Any) -> datetime | None:
        result = super().to_python(value)
        if result is None:
            return None
        try:
            return result.astimezone(UTC)
        except OverflowError as exc:
            raise forms.ValidationError("This time is outside the representable range.") from exc


class AuditFilterForm(forms.Form):
    tenant = forms.CharField(required=False)
    actor = forms.CharField(required=False)
    action = forms.CharField(required=False)
    since = UTCDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = UTCDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
