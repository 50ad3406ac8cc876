"""The forms of the retention admin: a new policy version, a review decision,
placing and releasing a legal hold, and the one reason field they share.

Apart from the model admins (``retention.admin``), which render them and call
the services: a form checks what it can show on its own fields (the reason's
rule, a hold's scope) and leaves the decision to the service, which checks
again. ``form_errors`` puts a service's ``ValidationError`` on the form's
fields.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from retention.inputs import MAX_TEXT_LENGTH, MIN_REASON_LENGTH, reason_problem
from retention.models import MAX_BATCH_SIZE, MIN_BATCH_SIZE, LegalHold
from retention.services import legal_hold_record_ref, legal_hold_scope_validate

# The services name their fields as the API does; the admin's forms call two of them otherwise.
_FORM_FIELD = {"review_note": "note"}


def form_errors(form: forms.BaseForm, exc: ValidationError) -> None:
    for field, errors in exc.message_dict.items():
        field = _FORM_FIELD.get(field, field)
        form.add_error(field if field in form.fields else None, errors)


def free_text_field(*, label: str = "Reason") -> forms.CharField:
    """A reason or note: the one rule of ``retention.inputs.reason_problem``
    (at most ``MAX_TEXT_LENGTH`` characters — the browser stops there too —
    at least ``MIN_REASON_LENGTH`` visible ones, no control or format
    characters), checked on the form so the error sits on the field and
    names it as the page does; the service checks it again."""

    def visible_reason(value: str) -> None:
        problem = reason_problem(value, field=label)
        if problem is not None:
            raise ValidationError(problem)

    return forms.CharField(
        label=label,
        max_length=MAX_TEXT_LENGTH,
        validators=[visible_reason],
        help_text=f"At least {MIN_REASON_LENGTH} visible characters; it goes into the audit trail.",
        widget=forms.Textarea(attrs={"rows": 3}),
    )


class NewVersionForm(forms.Form):
    retention_days = forms.IntegerField(min_value=1, max_value=36500)
    batch_size = forms.IntegerField(
        required=False,
        min_value=MIN_BATCH_SIZE,
        max_value=MAX_BATCH_SIZE,
        help_text="Rows per batch of one partition (reviewed like the retention period); empty: the active size.",
    )
    enabled = forms.BooleanField(required=False, initial=True, help_text="Untick to withdraw the policy.")
    reason = free_text_field()


class ReviewForm(forms.Form):
    """Nothing is preselected: approving or rejecting is a deliberate choice,
    and either one needs a note (the service requires it too)."""

    decision = forms.ChoiceField(
        choices=[("approve", "Approve"), ("reject", "Reject")],
        widget=forms.RadioSelect,
        error_messages={"required": "Choose Approve or Reject."},
    )
    note = free_text_field(label="Note")


class PlaceHoldForm(forms.ModelForm):
    reason = free_text_field()
    # Text, not the model's bigint: a kind keyed by UUID names its record by
    # the UUID. Which of the two the kind takes is the service's check.
    record_id = forms.CharField(
        required=False, max_length=64, label="Record id", help_text="An integer id, or a UUID for a kind keyed by UUID."
    )

    class Meta:
        model = LegalHold
        fields = ["portfolio", "property", "record_kind", "record_id", "reason"]

    def clean(self) -> dict[str, Any]:
        """The service's scope rules, shown on the form's fields (placing checks them again under its lock)."""
        super().clean()
        data = self.cleaned_data  # what ModelForm.clean returns (its declared type allows None)
        portfolio = data.get("portfolio")
        # The model's bigint gets the integer only (or nothing): a UUID goes to record_key.
        raw = (data.get("record_id") or "").strip() or None
        data["record_id"] = None
        if portfolio is not None and not self.errors:
            try:
                legal_hold_scope_validate(
                    portfolio=portfolio,
                    property=data.get("property"),
                    record_kind=data.get("record_kind") or "",
                    record_id=raw,
                )
                if raw is not None:
                    number, key = legal_hold_record_ref(record_kind=data.get("record_kind") or "", record_id=raw)
                    data["record_id"] = number
                    self.instance.record_key = key
            except ValidationError as exc:
                form_errors(self, exc)
        return data


class ReleaseForm(forms.Form):
    reason = free_text_field()
