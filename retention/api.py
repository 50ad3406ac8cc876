"""Retention's REST API under ``/api/v1/``: policies, policy versions, legal holds, audit events.

Views are thin: they check the role (``RolePermission``), see only the
portfolios where the user holds the read permission (``TenantScoped``:
another customer's object is a 404), validate input with a serializer, call
a ``retention.services`` function through ``call_service`` and render the
result. The router is wired in ``cleanup_ops/urls.py``.

Output serializers are read-only: the browsable API renders an action's form
from ``get_serializer_class``, which is the action's *input* serializer (a
note, a reason, a new version's days) — never a model serializer whose
related fields would list every portfolio's objects and every user as
choices. The one writable related field (a hold's portfolio and property) is
limited to the portfolios where the user may place holds.
"""

from __future__ import annotations

from typing import Any, cast

from django.db.models import CharField, QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from retention.apiutils import (
    ID_PATH_PATTERN,
    Conflict,
    ReasonField,
    ReasonSerializer,
    RecordIdField,
    RolePermission,
    StrictBooleanField,
    StrictIntegerField,
    StrictModelSerializer,
    StrictPrimaryKeyRelatedField,
    TenantScoped,
    call_service,
    filter_errors_as_400,
)
from retention.domain import portfolio_model, property_model, property_portfolio_attname
from retention.filters import audit_filter_parse
from retention.inputs import CONTROL_FREE_PATTERN, REASON_RULE
from retention.models import (
    MAX_BATCH_SIZE,
    MAX_RETENTION_DAYS,
    MIN_BATCH_SIZE,
    MIN_RETENTION_DAYS,
    AuditEvent,
    LegalHold,
    PolicyVersion,
    RetentionPolicy,
)
from retention.scoping import may_act_in, portfolios_where, scope_audit_events, scope_queryset
from retention.selectors import policy_version_impact
from retention.services import (
    ConcurrentApproval,
    legal_hold_place,
    legal_hold_release,
    policy_version_approve,
    policy_version_reject,
    policy_version_submit,
)

HOLD_ADD = "retention.add_legalhold"

# --- Serializers ----------------------------------------------------------------


class PolicyVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = PolicyVersion
        fields = [
            "id",
            "policy",
            "number",
            "retention_days",
            "batch_size",
            "enabled",
            "status",
            "author",
            "reason",
            "created_at",
            "reviewer",
            "reviewed_at",
            "review_note",
        ]
        read_only_fields = fields


class PolicySerializer(serializers.ModelSerializer):
    active_version = serializers.SerializerMethodField()

    class Meta:
        model = RetentionPolicy
        fields = ["id", "portfolio", "record_kind", "active_version"]
        read_only_fields = fields

    def get_active_version(self, obj: RetentionPolicy) -> dict[str, Any] | None:
        active = next((v for v in obj.versions.all() if v.status == PolicyVersion.Status.APPROVED), None)
        return (
            None
            if active is None
            else {
                "id": active.pk,
                "number": active.number,
                "retention_days": active.retention_days,
                "batch_size": active.batch_size,
                "enabled": active.enabled,
            }
        )


class NewVersionSerializer(serializers.Serializer):
    retention_days = StrictIntegerField(
        min_value=MIN_RETENTION_DAYS,
        max_value=MAX_RETENTION_DAYS,
        help_text="Days a record is kept after it ended (a JSON integer).",
    )
    batch_size = StrictIntegerField(
        required=False,
        min_value=MIN_BATCH_SIZE,
        max_value=MAX_BATCH_SIZE,
        help_text="Rows per batch of one partition; default: the active version's, or CLEANUP_BATCH_SIZE.",
    )
    enabled = StrictBooleanField(default=True)
    reason = ReasonField()


class ReviewSerializer(serializers.Serializer):
    note = ReasonField(help_text=f"Why (approving needs a note as much as rejecting). {REASON_RULE}")


class LegalHoldSerializer(StrictModelSerializer):
    """A legal hold: a portfolio, or one of its properties, a record kind or one record, kept from cleanup."""

    class Meta:
        model = LegalHold
        fields = [
            "id",
            "portfolio",
            "property",
            "record_kind",
            "record_id",
            "reason",
            "placed_by",
            "placed_at",
            "released_by",
            "released_at",
            "release_reason",
        ]
        read_only_fields = ["placed_by", "placed_at", "released_by", "released_at", "release_reason"]

    portfolio = StrictPrimaryKeyRelatedField(queryset=portfolio_model()._default_manager.none())
    property = StrictPrimaryKeyRelatedField(
        queryset=property_model()._default_manager.none(), required=False, allow_null=True
    )
    record_id = RecordIdField(required=False, allow_null=True)
    reason = ReasonField()

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = super().to_representation(instance)
        if isinstance(instance, LegalHold):
            data["record_id"] = instance.record_ref
        return data

    def get_fields(self) -> dict[str, Any]:
        # A hold may name only a portfolio where the user may place holds and
        # a property of such a portfolio. Any other id gets the answer an id
        # that does not exist gets: a 400 naming the field. Without a request
        # (rendering a response) there is nothing to choose from.
        fields = super().get_fields()
        request = self.context.get("request")
        if request is not None:
            # The two fields declared above (get_fields returns copies of them).
            portfolio = cast(StrictPrimaryKeyRelatedField, fields["portfolio"])
            property = cast(StrictPrimaryKeyRelatedField, fields["property"])
            portfolio.queryset = portfolios_where(request.user, HOLD_ADD)
            property.queryset = scope_queryset(
                property_model()._default_manager.all(),
                request.user,
                perm=HOLD_ADD,
                field=property_portfolio_attname(),
            )
        return fields


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "actor", "action", "object_type", "object_id", "reason", "details", "created_at"]
        read_only_fields = fields


# --- Views ----------------------------------------------------------------------


class PolicyViewSet(TenantScoped, viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = ID_PATH_PATTERN
    queryset = RetentionPolicy.objects.prefetch_related("versions").order_by("id")
    serializer_class = PolicySerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "retention.view_retentionpolicy",
        "retrieve": "retention.view_retentionpolicy",
        "versions": "retention.add_policyversion",
    }

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return NewVersionSerializer if self.action == "versions" else PolicySerializer

    @extend_schema(
        request=NewVersionSerializer,
        responses={
            201: PolicyVersionSerializer,
            400: OpenApiResponse(description="invalid retention_days, batch_size or reason"),
        },
    )
    @action(detail=True, methods=["post"])
    def versions(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        policy = self.get_object()
        if not may_act_in(request.user, "retention.add_policyversion", policy.portfolio_id):
            raise PermissionDenied("You are not a property manager of this policy's portfolio.")
        data = NewVersionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version = call_service(policy_version_submit, policy=policy, author=request.user, **data.validated_data)
        return Response(PolicyVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ImpactSerializer(serializers.Serializer):
    """``retention.selectors.ImpactPreview``: what approving a version would change, as counts."""

    active_days = serializers.IntegerField(allow_null=True)
    active_enabled = serializers.BooleanField()
    proposed_days = serializers.IntegerField()
    proposed_enabled = serializers.BooleanField()
    expired_now = serializers.IntegerField()
    held_now = serializers.IntegerField()
    eligible_now = serializers.IntegerField()
    expired_after = serializers.IntegerField()
    held_after = serializers.IntegerField()
    eligible_after = serializers.IntegerField()
    active_batch_size = serializers.IntegerField(allow_null=True)
    proposed_batch_size = serializers.IntegerField()
    batches_now = serializers.IntegerField()
    batches_after = serializers.IntegerField()
    rows_per_second = serializers.FloatField(allow_null=True)
    seconds_after = serializers.FloatField(allow_null=True)


class PolicyVersionViewSet(TenantScoped, viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = ID_PATH_PATTERN
    portfolio_field = "policy__portfolio_id"
    queryset = PolicyVersion.objects.order_by("-id")
    serializer_class = PolicyVersionSerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "retention.view_policyversion",
        "retrieve": "retention.view_policyversion",
        "approve": "retention.approve_policyversion",
        "reject": "retention.approve_policyversion",
        # The admin's review page shows it to whoever may see the version.
        "impact": "retention.view_policyversion",
    }

    def get_serializer_class(self) -> type[serializers.Serializer]:
        if self.action == "impact":
            return ImpactSerializer
        return ReviewSerializer if self.action in {"approve", "reject"} else PolicyVersionSerializer

    @extend_schema(responses={200: ImpactSerializer})
    @action(detail=True, methods=["get"])
    def impact(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """The impact preview of approving this version (the admin's): rows
        expired and held under the active version now and under this one,
        counted in the version's portfolio only."""
        return Response(ImpactSerializer(policy_version_impact(version=self.get_object())).data)

    def _review(self, request: Request, fn: Any) -> Response:
        version = self.get_object()
        data = ReviewSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            version = call_service(fn, version_id=version.pk, reviewer=request.user, note=data.validated_data["note"])
        except ConcurrentApproval as exc:
            raise Conflict(str(exc)) from None
        return Response(PolicyVersionSerializer(version).data)

    @extend_schema(
        request=ReviewSerializer,
        responses={
            200: PolicyVersionSerializer,
            400: OpenApiResponse(description="not in review, or note missing or too short"),
            403: OpenApiResponse(description="the author, or a role without the permission"),
            409: OpenApiResponse(description="another version of the policy was approved at the same moment"),
        },
    )
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return self._review(request, policy_version_approve)

    @extend_schema(
        request=ReviewSerializer,
        responses={
            200: PolicyVersionSerializer,
            400: OpenApiResponse(description="not in review, or note missing"),
            403: OpenApiResponse(description="the author, or a role without the permission"),
            409: OpenApiResponse(description="another version of the policy was approved at the same moment"),
        },
    )
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return self._review(request, policy_version_reject)


class LegalHoldViewSet(TenantScoped, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = ID_PATH_PATTERN
    queryset = LegalHold.objects.order_by("-id")
    serializer_class = LegalHoldSerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "retention.view_legalhold",
        "retrieve": "retention.view_legalhold",
        "create": "retention.add_legalhold",
        "release": "retention.change_legalhold",
    }

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return ReasonSerializer if self.action == "release" else LegalHoldSerializer

    @extend_schema(
        request=LegalHoldSerializer,
        responses={
            201: LegalHoldSerializer,
            400: OpenApiResponse(
                description="invalid scope (a record_id naming no record of that kind in the portfolio and property) "
                "or blank reason"
            ),
        },
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = LegalHoldSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        hold = call_service(
            legal_hold_place,
            portfolio=fields["portfolio"],
            property=fields.get("property"),
            record_kind=fields.get("record_kind", ""),
            record_id=fields.get("record_id"),
            reason=fields["reason"],
            placed_by=request.user,
        )
        return Response(LegalHoldSerializer(hold).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=ReasonSerializer,
        responses={200: LegalHoldSerializer, 400: OpenApiResponse(description="reason missing or already released")},
    )
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        hold = self.get_object()
        if not may_act_in(request.user, "retention.change_legalhold", hold.portfolio_id):
            raise PermissionDenied("You are not a compliance reviewer of this hold's portfolio.")
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        hold = call_service(
            legal_hold_release, hold_id=hold.pk, released_by=request.user, reason=data.validated_data["reason"]
        )
        return Response(LegalHoldSerializer(hold).data)


def _text_schema(column: str) -> dict[str, Any]:
    """A text filter on an audit trail column: at most the column's length (longer is a 400)."""
    field = cast("CharField[Any, Any]", AuditEvent._meta.get_field(column))
    return {"type": "string", "maxLength": field.max_length, "pattern": CONTROL_FREE_PATTERN}


class AuditEventViewSet(TenantScoped, viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = ID_PATH_PATTERN
    serializer_class = AuditEventSerializer
    permission_classes = [RolePermission]
    required_perms = {"list": "retention.view_auditevent", "retrieve": "retention.view_auditevent"}

    @extend_schema(
        parameters=[
            OpenApiParameter("action", _text_schema("action"), description="a part of the action, any case"),
            OpenApiParameter("object_type", _text_schema("object_type")),
            OpenApiParameter(
                "actor",
                {"type": "string", "maxLength": 150},
                description="a user's id (of the user model's key type) or username",
            ),
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def scope(self, queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        return scope_audit_events(queryset, self.request.user)

    def get_queryset(self) -> QuerySet[AuditEvent]:
        qs = AuditEvent.objects.order_by("-id")
        if self.action != "list":
            return qs
        with filter_errors_as_400():
            return qs.filter(audit_filter_parse(self.request.query_params, strict=True).q())
