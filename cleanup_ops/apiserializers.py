"""The pipeline API's serializers (``cleanup_ops.api``'s views use them).

Output serializers are read-only; input serializers are each action's form
in the browsable API (the view's ``get_serializer_class``), so no form lists
related objects. Apart from the views so that a reader of the routes finds
what each one checks and calls, and a reader of a payload finds its fields.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from cleanup_ops.recovery.operator import Decision
from cleanup_ops.selectors import sweep_figures_seen
from retention.apiutils import (
    FreeTextField,
    IdField,
    PortfolioKeyField,
    PropertyKeyField,
    ReasonSerializer,
    StrictChoiceField,
    StrictIntegerField,
    StrictRegexField,
)


class SweepSerializer(serializers.ModelSerializer):
    carried_over = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="null for a customer's staff: not attributed per portfolio"
    )

    class Meta:
        model = Sweep
        fields = [
            "id",
            "key",
            "slot",
            "status",
            "jobs_admitted",
            "carried_over",
            "created_at",
            "admitted_at",
            "finished_at",
        ]
        read_only_fields = fields

    def to_representation(self, instance: Sweep) -> dict[str, Any]:
        # A customer's staff see their own figures (cleanup_ops.selectors.sweeps_seen).
        data = super().to_representation(instance)
        seen = sweep_figures_seen(instance)
        if seen.get("finished_at") is not None:
            seen["finished_at"] = serializers.DateTimeField().to_representation(seen["finished_at"])
        return {**data, **seen}


class SweepDetailSerializer(SweepSerializer):
    jobs_by_state = serializers.SerializerMethodField()
    rows_deleted = serializers.SerializerMethodField()

    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "jobs_by_state", "rows_deleted"]
        read_only_fields = fields

    def get_jobs_by_state(self, obj: Sweep) -> dict[str, int]:
        return self.context["figures"]["jobs_by_state"]

    def get_rows_deleted(self, obj: Sweep) -> int:
        return self.context["figures"]["rows_deleted"]


class TriggerSerializer(serializers.Serializer):
    slot = FreeTextField(
        required=False, max_length=40, help_text="UTC minute, e.g. 2026-08-21T02:00Z; default: current slot"
    )


class TriggerResultSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    key = serializers.CharField()
    status = serializers.ChoiceField(choices=Sweep.Status.choices)
    created = serializers.BooleanField()
    jobs_admitted = serializers.IntegerField()
    carried_over = serializers.IntegerField()


class JobSerializer(serializers.ModelSerializer):
    # The host's keys as JSON carries them: a number, or a UUID's text.
    portfolio_id = PortfolioKeyField(read_only=True)
    property_id = PropertyKeyField(read_only=True, allow_null=True)

    class Meta:
        model = CleanupJob
        fields = [
            "id",
            "key",
            "sweep",
            "portfolio_id",
            "property_id",
            "record_kind",
            "policy_version",
            "cutoff",
            "state",
            "outcome",
            "attempt",
            "available_at",
            "lease_expires_at",
            "cursor",
            "batches",
            "batch_size",
            "rows_deleted",
            "rows_held",
            "last_error_category",
            "redrive_of",
            "created_at",
            "finished_at",
        ]
        # Related fields never take input here (no form lists jobs or versions).
        read_only_fields = ["sweep", "policy_version", "redrive_of"]


class DeadLetterSerializer(serializers.ModelSerializer):
    portfolio_id = PortfolioKeyField(read_only=True)
    property_id = PropertyKeyField(read_only=True, allow_null=True)

    class Meta:
        model = DeadLetter
        fields = [
            "id",
            "job",
            "sweep",
            "category",
            "error_class",
            "http_status",
            "message_class",
            "attempts",
            "first_seen_at",
            "last_seen_at",
            "portfolio_id",
            "property_id",
            "record_kind",
            "policy_version_id",
            "status",
            "resolved_by",
            "resolved_at",
            "resolution_reason",
            "redrive_job",
        ]
        # Related fields never take input here (no form lists jobs or users).
        read_only_fields = ["job", "sweep", "resolved_by", "redrive_job"]


#: A ``selectors.selection_digest``: sha256 in lower-case hex.
SEEN_PATTERN = r"^[0-9a-f]{64}$"

# At most this many ids in one bulk call: one transaction, one response.
BULK_MAX_IDS = 1000


class JobActionResultSerializer(serializers.Serializer):
    job = JobSerializer()
    dead_letter = serializers.IntegerField(allow_null=True, help_text="cancel: the job's new dead letter")


class BulkLetterDecisionSerializer(ReasonSerializer):
    """Decide the letters named by id, or every open letter matching a filter
    (the inbox's: ``category``, ``http_status``, ``kind``, ``portfolio``,
    ``sweep``, ``older_than_hours``), which then needs ``expected`` and
    ``seen``: the number of letters the caller saw and the list's digest of
    them, as the console's confirmation carries."""

    operation = StrictChoiceField(choices=Decision.choices)
    letter_ids = serializers.ListField(
        child=IdField(), required=False, allow_empty=False, max_length=BULK_MAX_IDS, help_text="the letters to decide"
    )
    filter = serializers.DictField(
        child=FreeTextField(max_length=40), required=False, help_text="an inbox filter instead of ids"
    )
    expected = StrictIntegerField(required=False, min_value=0, max_value=2**31 - 1)
    seen = StrictRegexField(
        SEEN_PATTERN,
        required=False,
        help_text="with a filter: the `seen` of GET /api/v1/dead-letters/?status=open and the same filter",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("letter_ids" in attrs) == ("filter" in attrs):
            raise ValidationError({"letter_ids": "give either letter_ids or filter, not both and not neither."})
        if "filter" in attrs and "expected" not in attrs:
            raise ValidationError({"expected": "a filter needs expected: the number of open letters it matched."})
        if "filter" in attrs and "seen" not in attrs:
            raise ValidationError(
                {"seen": "a filter needs seen: the digest the dead-letter list gave for the letters it matched."}
            )
        return attrs


class BulkLetterResultSerializer(serializers.Serializer):
    decided = serializers.ListField(child=serializers.IntegerField())
    jobs = serializers.ListField(child=serializers.IntegerField(), help_text="redrive: the new jobs")
    failed = serializers.ListField(child=serializers.DictField(), help_text="letters still open, and why")
    not_open = serializers.ListField(child=serializers.IntegerField(), help_text="matched but no longer open")
    not_found = serializers.ListField(child=serializers.IntegerField(), help_text="ids that are no letter of yours")


class PauseSerializer(ReasonSerializer):
    portfolio_id = PortfolioKeyField(required=False, allow_null=True, default=None)


class PauseResultSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="the pause")
    portfolio_id = PortfolioKeyField(allow_null=True, help_text="null: the whole pipeline")
