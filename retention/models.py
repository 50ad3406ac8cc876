"""Retention policies with four-eyes review, legal holds and the audit trail.

A policy's *versions* are immutable snapshots. Exactly one version per policy
can be ``approved`` (the active one); approving another supersedes it in the
same transaction (see ``services.policy_version_approve``). A version with
``enabled=False`` that gets approved is a withdrawal: the policy then deletes
nothing.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from retention import conf
from retention.registry import record_kind_choices

if TYPE_CHECKING:
    from retention.actors import Actor

MIN_RETENTION_DAYS = 1
MAX_RETENTION_DAYS = 36500
# Rows per batch of one partition: part of a policy version, reviewed like its
# retention period (row width, indexes and lock behaviour differ per kind and
# per customer). CLEANUP_BATCH_SIZE is the default for new policies.
MIN_BATCH_SIZE = 1
MAX_BATCH_SIZE = conf.MAX_BATCH_SIZE


class RetentionPolicy(models.Model):
    portfolio = models.ForeignKey(settings.RETENTION_PORTFOLIO_MODEL, on_delete=models.PROTECT, related_name="policies")
    record_kind = models.CharField(max_length=40, choices=record_kind_choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "retention policies"
        ordering = ["portfolio_id", "record_kind"]
        constraints = [
            models.UniqueConstraint(fields=["portfolio", "record_kind"], name="policy_unique_per_portfolio_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.portfolio} · {self.get_record_kind_display()}"


class PolicyVersionStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    IN_REVIEW = "in_review", "In review"
    APPROVED = "approved", "Approved (active)"
    SUPERSEDED = "superseded", "Superseded"
    REJECTED = "rejected", "Rejected"


class ImmutableVersion(Exception):
    pass


def default_batch_size() -> int:
    """New policies start with the deployment's ``CLEANUP_BATCH_SIZE``."""
    return int(settings.CLEANUP_BATCH_SIZE)


class PolicyVersionQuerySet(models.QuerySet["PolicyVersion"]):
    def in_force(self) -> PolicyVersionQuerySet:
        """The versions that delete: approved (one per policy) and enabled.

        An approved version unticked is a withdrawn policy: it stays the
        policy's active version but deletes nothing. Every reader that asks
        "what deletes now" (admission, the drop's largest cutoff, the console's
        debt) asks here; the batch's own SQL re-reads the same two columns
        under its locks."""
        return self.filter(status=PolicyVersionStatus.APPROVED, enabled=True)


class PolicyVersion(models.Model):
    Status = PolicyVersionStatus

    policy = models.ForeignKey(RetentionPolicy, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    retention_days = models.IntegerField(
        validators=[MinValueValidator(MIN_RETENTION_DAYS), MaxValueValidator(MAX_RETENTION_DAYS)]
    )
    enabled = models.BooleanField(default=True, help_text="Unticked: the policy is withdrawn and deletes nothing.")
    batch_size = models.PositiveIntegerField(
        default=default_batch_size,
        validators=[MinValueValidator(MIN_BATCH_SIZE), MaxValueValidator(MAX_BATCH_SIZE)],
        help_text="Rows per batch of one partition; applies from the next batch on once approved.",
    )
    status = models.CharField(max_length=20, choices=PolicyVersionStatus.choices, default=PolicyVersionStatus.DRAFT)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_note = models.TextField(blank=True, default="")

    objects = PolicyVersionQuerySet.as_manager()

    class Meta:
        ordering = ["policy_id", "-number"]
        permissions = [("approve_policyversion", "Can approve or reject policy versions")]
        constraints = [
            models.UniqueConstraint(fields=["policy", "number"], name="policyversion_unique_number"),
            models.UniqueConstraint(
                fields=["policy"],
                condition=Q(status="approved"),
                name="policyversion_one_active_per_policy",
            ),
            models.CheckConstraint(
                condition=Q(retention_days__gte=MIN_RETENTION_DAYS, retention_days__lte=MAX_RETENTION_DAYS),
                name="policyversion_retention_days_range",
            ),
            models.CheckConstraint(
                condition=Q(batch_size__gte=MIN_BATCH_SIZE, batch_size__lte=MAX_BATCH_SIZE),
                name="policyversion_batch_size_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.policy} v{self.number}"

    @property
    def is_frozen(self) -> bool:
        return self.status in {self.Status.APPROVED, self.Status.SUPERSEDED, self.Status.REJECTED}

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Reviewed versions are immutable. The only write allowed on one is
        # the supersede transition, which touches `status` alone.
        if self.pk is not None and not self._state.adding:
            stored = PolicyVersion.objects.filter(pk=self.pk).values_list("status", flat=True).first()
            if stored in {self.Status.APPROVED, self.Status.SUPERSEDED, self.Status.REJECTED}:
                update_fields = set(kwargs.get("update_fields") or [])
                superseding = (
                    stored == self.Status.APPROVED
                    and self.status == self.Status.SUPERSEDED
                    and update_fields == {"status"}
                )
                if not superseding:
                    raise ImmutableVersion(f"policy version {self.pk} is {stored} and cannot be changed")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        if self.is_frozen:
            raise ImmutableVersion(f"policy version {self.pk} is {self.status} and cannot be deleted")
        return super().delete(*args, **kwargs)

    # State transitions: each saves only the fields it changes.
    def mark_submitted(self, *, at: datetime) -> None:
        self.status = self.Status.IN_REVIEW
        self.submitted_at = at
        self.save(update_fields=["status", "submitted_at"])

    def mark_reviewed(self, *, approved: bool, reviewer: Actor, at: datetime, note: str) -> None:
        self.status = self.Status.APPROVED if approved else self.Status.REJECTED
        self.reviewer = reviewer
        self.reviewed_at = at
        self.review_note = note
        self.save(update_fields=["status", "reviewer", "reviewed_at", "review_note"])

    def mark_superseded(self) -> None:
        self.status = self.Status.SUPERSEDED
        self.save(update_fields=["status"])


class LegalHoldQuerySet(models.QuerySet):
    def active(self) -> LegalHoldQuerySet:
        return self.filter(released_at__isnull=True)


class LegalHold(models.Model):
    """Blocks deletion in its scope until released.

    Scope: a portfolio, optionally narrowed to one property, one record kind,
    and/or one record id (a record id needs a record kind to mean anything).
    """

    portfolio = models.ForeignKey(
        settings.RETENTION_PORTFOLIO_MODEL, on_delete=models.PROTECT, related_name="legal_holds"
    )
    property = models.ForeignKey(
        settings.RETENTION_PROPERTY_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="legal_holds"
    )
    record_kind = models.CharField(max_length=40, choices=record_kind_choices, blank=True, default="")
    record_id = models.BigIntegerField(null=True, blank=True)
    # The record of a kind whose key is not an integer (a UUID), as the
    # database spells it as text; record_id is then NULL (``record_ref``).
    record_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    reason = models.TextField()
    placed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    placed_at = models.DateTimeField()
    released_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.TextField(blank=True, default="")

    objects = LegalHoldQuerySet.as_manager()

    class Meta:
        ordering = ["-placed_at"]
        indexes = [
            models.Index(
                fields=["portfolio", "property"], condition=Q(released_at__isnull=True), name="legalhold_active_idx"
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(record_id__isnull=True) | ~Q(record_kind=""),
                name="legalhold_record_needs_kind",
            ),
            models.CheckConstraint(
                condition=Q(record_key="") | (~Q(record_kind="") & Q(record_id__isnull=True)),
                name="legalhold_record_key_needs_kind",
            ),
        ]

    def __str__(self) -> str:
        parts = [str(self.portfolio_id)]
        if self.property_id:
            parts.append(f"property {self.property_id}")
        if self.record_kind:
            parts.append(self.record_kind)
        if self.record_ref:
            parts.append(f"#{self.record_ref}")
        return f"Hold {self.pk} ({', '.join(parts)})"

    @builtins.property
    def record_ref(self) -> int | str | None:
        """The one record held: its integer id, or its key's text."""
        return self.record_id if self.record_id is not None else (self.record_key or None)

    @builtins.property  # `property` is a field name in this class body
    def is_active(self) -> bool:
        return self.released_at is None

    def mark_released(self, *, by: Actor, at: datetime, reason: str) -> None:
        self.released_by = by
        self.released_at = at
        self.release_reason = reason
        self.save(update_fields=["released_by", "released_at", "release_reason"])


class AppendOnlyError(Exception):
    pass


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> NoReturn:
        raise AppendOnlyError("audit events are append-only")

    def delete(self) -> NoReturn:
        raise AppendOnlyError("audit events are append-only")


def validate_audit_details(value: object) -> None:
    """Details hold identifiers and counts only: flat, scalar, short."""
    if not isinstance(value, dict):
        raise ValidationError("details must be an object")
    for key, item in value.items():
        items = item if isinstance(item, list) else [item]
        for element in items:
            if element is None or isinstance(element, bool | int | float):
                continue
            if isinstance(element, str) and len(element) <= 100:
                continue
            raise ValidationError(f"details[{key!r}] must be identifiers or counts (scalars or lists of scalars)")


class AuditEvent(models.Model):
    """One operator or reviewer decision. Never changed, never deleted."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT)
    action = models.CharField(max_length=60)
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    details = models.JSONField(default=dict, blank=True, validators=[validate_audit_details])
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id"], name="auditevent_object_idx")]

    def __str__(self) -> str:
        return f"{self.action} {self.object_type}:{self.object_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError("audit events are append-only")
        validate_audit_details(self.details)
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AppendOnlyError("audit events are append-only")


class MembershipRole(models.TextChoices):
    """A customer's staff role in one portfolio (permissions: ``roles.MEMBERSHIP_ROLE_PERMISSIONS``)."""

    PROPERTY_MANAGER = "property_manager", "Property manager"
    COMPLIANCE_REVIEWER = "compliance_reviewer", "Compliance reviewer"
    AUDITOR = "auditor", "Auditor"


class Membership(models.Model):
    """A user is a member of a portfolio with a role there.

    Customer staff see and act in the portfolios of their memberships only,
    with the role held *in that portfolio*; the platform's staff (groups in
    ``roles.PLATFORM_GROUPS``) need none. One user may hold several roles in
    one portfolio (one row each) and memberships in many portfolios. Granted
    and revoked through ``services.membership_grant``/``membership_revoke``,
    each an audit event.
    """

    Role = MembershipRole

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    portfolio = models.ForeignKey(
        settings.RETENTION_PORTFOLIO_MODEL, on_delete=models.PROTECT, related_name="memberships"
    )
    role = models.CharField(max_length=30, choices=MembershipRole.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["portfolio_id", "user_id", "role"]
        constraints = [
            # Leads with user: "this user's portfolios" is the hot lookup (every request).
            models.UniqueConstraint(fields=["user", "portfolio", "role"], name="membership_unique_user_portfolio_role"),
        ]

    def __str__(self) -> str:
        return f"{self.user} · {self.get_role_display()} of portfolio {self.portfolio_id}"
