"""Writes for policies, legal holds and the audit trail.

Legal-hold race (docs/architecture.md, "The legal-hold race"): placing a hold takes its scope's row lock
``FOR UPDATE`` (the portfolio row for a portfolio-wide hold, the property row
otherwise). A cleanup batch takes the portfolio and property rows
``FOR SHARE`` before its DELETE, and a purge takes those of every deleted
record that named its document. Under READ COMMITTED the batch therefore
either sees the committed hold or commits before the hold is placed.

Approving a version (or withdrawing a policy, which is approving a disabled
one) takes its portfolio's row ``FOR UPDATE`` the same way, so a batch reads
the policy after its scope locks and sees every approval committed before
them; none commits while it runs.

Bounded waits for people: these locks are waited for at most
``CLEANUP_SCOPE_LOCK_WAIT_SECONDS`` (PostgreSQL's ``lock_timeout``, set for
that one statement); then ``ScopeBusy`` says what it waited for. A stalled
worker never blocks a reviewer for longer, and its own session is ended by
PostgreSQL once it sits idle in its transaction past
``CLEANUP_IDLE_IN_TRANSACTION_SECONDS``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Max, Model
from django.utils import timezone

from retention.actors import Actor
from retention.domain import portfolio_model, property_model, property_portfolio_id
from retention.inputs import MAX_TEXT_LENGTH, reason_problem, text_problem
from retention.models import (
    MAX_BATCH_SIZE,
    MAX_RETENTION_DAYS,
    MIN_BATCH_SIZE,
    MIN_RETENTION_DAYS,
    AuditEvent,
    LegalHold,
    Membership,
    PolicyVersion,
    RetentionPolicy,
    default_batch_size,
)
from retention.registry import get_spec
from retention.scoping import forget_cached_scope, may_act_in


def free_text(value: str, *, field: str) -> str:
    """The trimmed text if it is acceptable free text (``retention.inputs``:
    at most ``MAX_TEXT_LENGTH`` characters, no control characters), else a
    ValidationError naming ``field``. Every reason and note passes here
    before it is stored, whichever route it came by."""
    if not isinstance(value, str):
        raise ValidationError({field: f"{field} must be text."})
    problem = text_problem(value, field=field, max_length=MAX_TEXT_LENGTH)
    if problem is not None:
        raise ValidationError({field: problem})
    return value.strip()


def require_reason(value: str, *, field: str) -> str:
    """The trimmed reason (or review note), or a ValidationError naming
    ``field``: free text (``free_text``) with at least ``MIN_REASON_LENGTH``
    visible characters and no format characters (``retention.inputs.reason_problem``).
    Every reason and note of every route passes here: one rule for all."""
    if not isinstance(value, str):
        raise ValidationError({field: f"{field} must be text."})
    problem = reason_problem(value, field=field)
    if problem is not None:
        raise ValidationError({field: problem})
    return value.strip()


class ScopeBusy(ValidationError):
    """A scope lock was not granted within ``CLEANUP_SCOPE_LOCK_WAIT_SECONDS``:
    a cleanup batch, purge or table-partition drop of that scope is in flight (or stalled)."""

    def __init__(self, *, what: str, field: str) -> None:
        seconds = settings.CLEANUP_SCOPE_LOCK_WAIT_SECONDS
        super().__init__(
            {
                field: f"waited {seconds:g} s for the cleanup batch, purge or table-partition drop working on {what} "
                "to finish; nothing was saved. Try again in a moment."
            }
        )


def scope_lock(*, portfolio_id: int, property_id: int | None, field: str) -> None:
    """Lock a hold's or a version's scope row ``FOR UPDATE`` (the property row
    when given, else the portfolio row), waiting at most
    ``CLEANUP_SCOPE_LOCK_WAIT_SECONDS``; ``ScopeBusy`` after that. Call inside
    a transaction."""
    model, pk, what = (
        (property_model(), property_id, f"property {property_id}")
        if property_id is not None
        else (portfolio_model(), portfolio_id, f"portfolio {portfolio_id}")
    )
    timeout = str(max(1, round(settings.CLEANUP_SCOPE_LOCK_WAIT_SECONDS * 1000)))
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)", [timeout])
        (previous, _) = cur.fetchone()
        try:
            # A savepoint, so a timeout leaves the caller's transaction usable
            # for its own clean-up (it rolls back anyway: nothing is saved).
            with transaction.atomic():
                model._default_manager.select_for_update().filter(pk=pk).get()
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # lock_not_available
                raise ScopeBusy(what=what, field=field) from None
            raise
        finally:
            cur.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def audit_event_record(
    *,
    actor: Actor | None,
    action: str,
    object_type: str,
    object_id: object,
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        reason=reason,
        details=_details_json(details or {}),
    )


def _details_json(details: dict[str, Any]) -> dict[str, Any]:
    """The details with each key of a customer, a site or a user as JSON
    carries it: a UUID as its text (``retention.domain.key_json``), an
    integer as a number, as before."""

    def one(value: Any) -> Any:
        return str(value) if isinstance(value, uuid.UUID) else value

    return {name: [one(v) for v in value] if isinstance(value, list) else one(value) for name, value in details.items()}


def retention_policy_get_or_create(*, portfolio: Model, record_kind: str) -> RetentionPolicy:
    try:
        get_spec(record_kind)
    except ValueError as exc:
        raise ValidationError({"record_kind": str(exc)}) from None
    policy, _ = RetentionPolicy.objects.get_or_create(portfolio=portfolio, record_kind=record_kind)
    return policy


def _validate_retention_days(retention_days: object) -> int:
    if isinstance(retention_days, bool) or not isinstance(retention_days, int):
        raise ValidationError({"retention_days": "retention_days must be a whole number of days."})
    if not MIN_RETENTION_DAYS <= retention_days <= MAX_RETENTION_DAYS:
        raise ValidationError(
            {"retention_days": f"retention_days must be between {MIN_RETENTION_DAYS} and {MAX_RETENTION_DAYS}."}
        )
    return retention_days


def _validate_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ValidationError({"batch_size": "batch_size must be a whole number of rows."})
    if not MIN_BATCH_SIZE <= batch_size <= MAX_BATCH_SIZE:
        raise ValidationError({"batch_size": f"batch_size must be between {MIN_BATCH_SIZE} and {MAX_BATCH_SIZE}."})
    return batch_size


def policy_version_submit(
    *,
    policy: RetentionPolicy,
    retention_days: int,
    enabled: bool = True,
    batch_size: int | None = None,
    author: Actor,
    reason: str,
) -> PolicyVersion:
    """Create the next version of ``policy`` and put it in review.

    ``batch_size`` (rows per batch of one partition, reviewed like the
    retention period) defaults to the active version's, or for a new policy
    to ``CLEANUP_BATCH_SIZE``."""
    days = _validate_retention_days(retention_days)
    size = None if batch_size is None else _validate_batch_size(batch_size)
    reason = require_reason(reason, field="reason")
    now = timezone.now()
    with transaction.atomic():
        # The policy row lock serialises version numbering.
        RetentionPolicy.objects.select_for_update().filter(pk=policy.pk).get()
        last = PolicyVersion.objects.filter(policy=policy).aggregate(n=Max("number"))["n"] or 0
        if size is None:
            active = policy.versions.filter(status=PolicyVersion.Status.APPROVED).values_list("batch_size", flat=True)
            size = active.first() or default_batch_size()
        version = PolicyVersion.objects.create(
            policy=policy,
            number=last + 1,
            retention_days=days,
            batch_size=size,
            enabled=enabled,
            status=PolicyVersion.Status.IN_REVIEW,
            author=author,
            reason=reason,
            submitted_at=now,
        )
        audit_event_record(
            actor=author,
            action="policy_version.submitted",
            object_type="policy_version",
            object_id=version.pk,
            reason=reason,
            details={
                "policy_id": policy.pk,
                "portfolio_id": policy.portfolio_id,
                "record_kind": policy.record_kind,
                "number": version.number,
                "retention_days": days,
                "batch_size": size,
                "enabled": enabled,
            },
        )
    return version


class ConcurrentApproval(Exception):
    """Another version of the same policy was approved at the same moment.

    The database allows one active version per policy: of two approvals whose
    transactions overlap, the first to commit wins and the other fails on that
    constraint. Its reviewer compared against a version that is no longer the
    active one, so the answer is a conflict (HTTP 409), and the version stays in
    review for a fresh look.
    """

    def __init__(self, version_id: int) -> None:
        super().__init__(
            f"policy version {version_id} was not approved: another version of the same policy was approved "
            "at the same moment. Review it again against the version now active."
        )
        self.version_id = version_id


def _review(*, version_id: int, reviewer: Actor, note: str, approve: bool) -> PolicyVersion:
    if not reviewer.has_perm("retention.approve_policyversion"):
        raise PermissionDenied("You do not have permission to review policy versions.")
    # Four-eyes within a customer: a customer's reviewer reviews only in the
    # portfolios where they hold the role; a platform reviewer anywhere.
    portfolio_id = PolicyVersion.objects.filter(pk=version_id).values_list("policy__portfolio_id", flat=True).first()
    if portfolio_id is not None and not may_act_in(reviewer, "retention.approve_policyversion", portfolio_id):
        raise PermissionDenied("You are not a compliance reviewer of this policy's portfolio.")
    # Approving needs a written note as much as rejecting: it is the record
    # of why a retention period changed (checked after the permission, so a
    # user who may not review learns nothing from the answer).
    note = require_reason(note, field="review_note")
    # The active version as this approval starts: if another approval of the
    # same policy commits while this one waits for the policy's row lock, the
    # active version it finds there differs, and this one is the conflict.
    seen_active = _active_version_id(version_id=version_id) if approve else None
    try:
        return _review_once(
            version_id=version_id, reviewer=reviewer, note=note, approve=approve, seen_active=seen_active
        )
    except IntegrityError:
        # The database's one-active-version rule, should two approvals ever
        # overlap without meeting on the policy row lock.
        if approve and _another_version_approved(version_id=version_id):
            raise ConcurrentApproval(version_id) from None
        raise


def _active_version_id(*, version_id: int) -> int | None:
    policy_id = PolicyVersion.objects.filter(pk=version_id).values_list("policy_id", flat=True).first()
    return (
        PolicyVersion.objects.filter(policy_id=policy_id, status=PolicyVersion.Status.APPROVED)
        .values_list("pk", flat=True)
        .first()
    )


def _another_version_approved(*, version_id: int) -> bool:
    policy_id = PolicyVersion.objects.filter(pk=version_id).values_list("policy_id", flat=True).first()
    return (
        PolicyVersion.objects.filter(policy_id=policy_id, status=PolicyVersion.Status.APPROVED)
        .exclude(pk=version_id)
        .exists()
    )


def _review_once(
    *, version_id: int, reviewer: Actor, note: str, approve: bool, seen_active: int | None
) -> PolicyVersion:
    now = timezone.now()
    with transaction.atomic():
        portfolio_id = PolicyVersion.objects.filter(pk=version_id).values_list("policy__portfolio_id", flat=True).get()
        # The portfolio's scope lock first (a batch reads the policy after
        # taking it FOR SHARE), then the version and (select_related) its
        # policy's row: reviews of one policy are serialised there.
        scope_lock(portfolio_id=portfolio_id, property_id=None, field="__all__")
        version = PolicyVersion.objects.select_for_update().select_related("policy").get(pk=version_id)
        if version.status != PolicyVersion.Status.IN_REVIEW:
            raise ValidationError({"status": f"policy version {version.pk} is {version.status}, not in review."})
        if version.author_id == reviewer.pk:
            raise PermissionDenied("The author of a policy version cannot review it (four-eyes rule).")
        superseded_id = None
        if approve:
            previous = (
                PolicyVersion.objects.select_for_update()
                .filter(policy_id=version.policy_id, status=PolicyVersion.Status.APPROVED)
                .first()
            )
            if (previous.pk if previous is not None else None) != seen_active:
                raise ConcurrentApproval(version.pk)
            if previous is not None:
                previous.mark_superseded()
                superseded_id = previous.pk
        version.mark_reviewed(approved=approve, reviewer=reviewer, at=now, note=note.strip())
        audit_event_record(
            actor=reviewer,
            action="policy_version.approved" if approve else "policy_version.rejected",
            object_type="policy_version",
            object_id=version.pk,
            reason=note.strip(),
            details={
                "policy_id": version.policy_id,
                "portfolio_id": version.policy.portfolio_id,
                "record_kind": version.policy.record_kind,
                "number": version.number,
                "retention_days": version.retention_days,
                "batch_size": version.batch_size,
                "enabled": version.enabled,
                "superseded_version_id": superseded_id,
            },
        )
    return version


def policy_version_approve(*, version_id: int, reviewer: Actor, note: str) -> PolicyVersion:
    """Make a version active; the previously active one is superseded atomically."""
    return _review(version_id=version_id, reviewer=reviewer, note=note, approve=True)


def policy_version_reject(*, version_id: int, reviewer: Actor, note: str) -> PolicyVersion:
    return _review(version_id=version_id, reviewer=reviewer, note=note, approve=False)


def legal_hold_record_ref(*, record_kind: str, record_id: object) -> tuple[int | None, str]:
    """(``record_id``, ``record_key``) of a hold naming ``record_id``: the
    kind's key type decides — an integer goes to ``record_id``, a UUID to
    ``record_key`` as the database spells it (``RecordKindSpec.key_text``).
    A value of the wrong type is a ValidationError naming ``record_id``."""
    if record_id is None or record_id == "":
        return None, ""
    spec = get_spec(record_kind)
    if spec.integer_key:
        text = str(record_id).strip()
        if isinstance(record_id, bool) or not (isinstance(record_id, int) or text.isdigit()) or len(text) > 19:
            raise ValidationError(
                {"record_id": f"a {spec.label.lower()}'s id is an integer; {record_id!r} is not one."}
            )
        return int(text), ""
    try:
        return None, spec.key_text(record_id)
    except (TypeError, ValueError, AttributeError):
        raise ValidationError(
            {"record_id": f"a {spec.label.lower()}'s id is a UUID; {str(record_id)[:64]!r} is not one."}
        ) from None


def legal_hold_scope_validate(
    *, portfolio: Model, property: Model | None = None, record_kind: str = "", record_id: object = None
) -> None:
    """A record-level hold must name a record that exists, of ``record_kind``,
    in ``portfolio`` (and in ``property`` when one is given); otherwise a
    ValidationError naming ``record_id``.

    A hold naming nothing would protect nothing, and a hold naming a record
    that is already gone would make it look as though that record were kept.
    One message for "no such record" and "a record of another portfolio", so
    the answer never tells whether an id exists elsewhere.
    """
    # A property of another portfolio would make a hold that protects nothing
    # it names (the scope lock and the delete both key on the pair).
    if property is not None and property_portfolio_id(property) != portfolio.pk:
        raise ValidationError({"property": f"{property} is not a property of {portfolio}; choose one of its own."})
    if record_kind and property is not None:
        try:
            spec = get_spec(record_kind)
        except ValueError as exc:
            raise ValidationError({"record_kind": str(exc)}) from None
        if not spec.has_property:
            # Such a hold would protect nothing: no record of the kind is in a property.
            raise ValidationError(
                {
                    "property": f"a {spec.label.lower()} belongs to no property; "
                    "place the hold on the portfolio (or on one record) instead."
                }
            )
    if record_id is None or record_id == "":
        return
    if not record_kind:
        raise ValidationError({"record_kind": "record_kind is required when record_id is given."})
    try:
        spec = get_spec(record_kind)
    except ValueError as exc:
        raise ValidationError({"record_kind": str(exc)}) from None
    number, key = legal_hold_record_ref(record_kind=record_kind, record_id=record_id)
    where: dict[str, object] = {"pk": number if key == "" else key, spec.portfolio_field: portfolio.pk}
    scope = f"portfolio {portfolio.pk}"
    if property is not None and spec.property_field is not None:
        # A path is an ORM lookup too ("unit__building").
        where[spec.property_field] = property.pk
        scope += f", property {property.pk}"
    records = spec.model._default_manager.filter(**where)
    if not records.exists():
        raise ValidationError({"record_id": f"there is no {spec.label.lower()} with id {record_id} in {scope}."})


def legal_hold_place(
    *,
    portfolio: Model,
    placed_by: Actor,
    reason: str,
    property: Model | None = None,
    record_kind: str = "",
    record_id: int | str | None = None,
) -> LegalHold:
    reason = require_reason(reason, field="reason")
    if record_kind:
        try:
            get_spec(record_kind)
        except ValueError as exc:
            raise ValidationError({"record_kind": str(exc)}) from None
    if record_id is not None and not record_kind:
        raise ValidationError({"record_kind": "record_kind is required when record_id is given."})
    if property is not None and property_portfolio_id(property) != portfolio.pk:
        raise ValidationError({"property": f"{property} is not a property of {portfolio}; choose one of its own."})
    with transaction.atomic():
        # Scope lock: see the module docstring (the hold race).
        scope_lock(
            portfolio_id=portfolio.pk,
            property_id=property.pk if property else None,
            field="property" if property else "portfolio",
        )
        # Under the scope lock: a batch deleting the record either committed
        # before (the record is gone: refused) or waits for this hold.
        legal_hold_scope_validate(portfolio=portfolio, property=property, record_kind=record_kind, record_id=record_id)
        number, key = legal_hold_record_ref(record_kind=record_kind, record_id=record_id)
        hold = LegalHold.objects.create(  # type: ignore[misc]  # the host's models, the demo's to the plugin
            portfolio=portfolio,
            property=property,
            record_kind=record_kind,
            record_id=number,
            record_key=key,
            reason=reason,
            placed_by=placed_by,
            placed_at=timezone.now(),
        )
        audit_event_record(
            actor=placed_by,
            action="legal_hold.placed",
            object_type="legal_hold",
            object_id=hold.pk,
            reason=reason,
            details={
                "portfolio_id": portfolio.pk,
                "property_id": property.pk if property else None,
                "record_kind": record_kind or None,
                "record_id": hold.record_ref,
            },
        )
    return hold


def legal_hold_release(*, hold_id: int, released_by: Actor, reason: str) -> LegalHold:
    reason = require_reason(reason, field="reason")
    with transaction.atomic():
        hold = LegalHold.objects.select_for_update().get(pk=hold_id)
        if not hold.is_active:
            raise ValidationError(
                {"hold": f"legal hold {hold.pk} was already released at {hold.released_at:%Y-%m-%d %H:%M}Z."}
            )
        hold.mark_released(by=released_by, at=timezone.now(), reason=reason)
        audit_event_record(
            actor=released_by,
            action="legal_hold.released",
            object_type="legal_hold",
            object_id=hold.pk,
            reason=reason,
            details={"portfolio_id": hold.portfolio_id, "property_id": hold.property_id},
        )
    return hold


def membership_grant(*, user: Actor, portfolio: Model, role: str, granted_by: Actor | None) -> Membership:
    """Make ``user`` a member of ``portfolio`` with ``role`` (idempotent), as an audit event."""
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"role must be one of {', '.join(Membership.Role.values)}."})
    with transaction.atomic():
        membership, created = Membership.objects.get_or_create(user=user, portfolio=portfolio, role=role)
        if created:
            audit_event_record(
                actor=granted_by,
                action="membership.granted",
                object_type="membership",
                object_id=membership.pk,
                details={"portfolio_id": portfolio.pk, "user_id": str(user.pk), "role": role},
            )
    forget_cached_scope(user)
    return membership


def membership_revoke(*, membership_id: int, revoked_by: Actor | None) -> None:
    with transaction.atomic():
        membership = Membership.objects.select_for_update().get(pk=membership_id)
        # The user's id as text: JSON has no UUID, and one type whatever the user model's key.
        details = {"portfolio_id": membership.portfolio_id, "user_id": str(membership.user_id), "role": membership.role}
        membership.delete()
        audit_event_record(
            actor=revoked_by,
            action="membership.revoked",
            object_type="membership",
            object_id=membership_id,
            details=details,
        )
