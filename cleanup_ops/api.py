"""REST API under ``/api/v1/`` (DRF; token and session auth; paginated).

Views are thin: they check the role (``RolePermission`` maps each action to a
Django permission), validate input with a serializer, call a service and
render the result. Service errors map to HTTP: ``ValidationError`` → 400,
``PermissionDenied`` → 403, ``DeadLetterNotOpen`` → 409.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count, QuerySet, Sum
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, PermissionDenied, ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from cleanup_ops.models import CleanupJob, DeadLetter, JobState, Sweep
from cleanup_ops.proof import proof_csv, sweep_proof
from cleanup_ops.selectors import overview
from cleanup_ops.services import (
    DeadLetterNotOpen,
    SlotError,
    dead_letter_dismiss,
    dead_letter_redrive,
    pipeline_pause,
    pipeline_resume,
    slot_parse,
    sweep_trigger,
)
from retention.models import AuditEvent, LegalHold, PolicyVersion, RetentionPolicy
from retention.services import (
    legal_hold_place,
    legal_hold_release,
    policy_version_approve,
    policy_version_reject,
    policy_version_submit,
)


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflict"


class RolePermission(BasePermission):
    """Each view declares ``required_perms = {action: "app.codename"}``."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        perm = getattr(view, "required_perms", {}).get(getattr(view, "action", None) or request.method.lower())
        return perm is None or request.user.has_perm(perm)


def call_service(fn: Any, **kwargs: Any) -> Any:
    try:
        return fn(**kwargs)
    except DjangoValidationError as exc:
        raise ValidationError(exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}) from None
    except DjangoPermissionDenied as exc:
        raise PermissionDenied(str(exc) or None) from None
    except DeadLetterNotOpen as exc:
        raise Conflict(str(exc)) from None


def int_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: f"{name} must be an integer id"}) from None
    if not 0 <= value < 2**63:
        raise ValidationError({name: f"{name} must be an id between 0 and 2^63-1"})
    return value


def choice_param(request: Request, name: str, choices: list[str]) -> str | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    if raw not in choices:
        raise ValidationError({name: f"{name} must be one of {', '.join(choices)}"})
    return raw


# --- Serializers ----------------------------------------------------------------


class SweepSerializer(serializers.ModelSerializer):
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


class SweepDetailSerializer(SweepSerializer):
    jobs_by_state = serializers.SerializerMethodField()
    rows_deleted = serializers.SerializerMethodField()

    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "jobs_by_state", "rows_deleted"]

    def get_jobs_by_state(self, obj: Sweep) -> dict[str, int]:
        return self.context["figures"]["jobs_by_state"]

    def get_rows_deleted(self, obj: Sweep) -> int:
        return self.context["figures"]["rows_deleted"]


class TriggerSerializer(serializers.Serializer):
    slot = serializers.CharField(required=False, help_text="UTC minute, e.g. 2026-08-21T02:00Z; default: current slot")


class TriggerResultSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    key = serializers.CharField()
    status = serializers.CharField()
    created = serializers.BooleanField()
    jobs_admitted = serializers.IntegerField()
    carried_over = serializers.IntegerField()


class JobSerializer(serializers.ModelSerializer):
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
            "rows_deleted",
            "rows_held",
            "last_error_category",
            "redrive_of",
            "created_at",
            "finished_at",
        ]


class DeadLetterSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeadLetter
        fields = [
            "id",
            "job",
            "sweep",
            "category",
            "error_class",
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


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class PolicyVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = PolicyVersion
        fields = [
            "id",
            "policy",
            "number",
            "retention_days",
            "enabled",
            "status",
            "author",
            "reason",
            "created_at",
            "reviewer",
            "reviewed_at",
            "review_note",
        ]


class PolicySerializer(serializers.ModelSerializer):
    active_version = serializers.SerializerMethodField()

    class Meta:
        model = RetentionPolicy
        fields = ["id", "portfolio", "record_kind", "active_version"]

    def get_active_version(self, obj: RetentionPolicy) -> dict[str, Any] | None:
        active = next((v for v in obj.versions.all() if v.status == PolicyVersion.Status.APPROVED), None)
        return (
            None
            if active is None
            else {
                "id": active.pk,
                "number": active.number,
                "retention_days": active.retention_days,
                "enabled": active.enabled,
            }
        )


class NewVersionSerializer(serializers.Serializer):
    retention_days = serializers.IntegerField()
    enabled = serializers.BooleanField(default=True)
    reason = serializers.CharField(allow_blank=True)


class ReviewSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, default="")


class LegalHoldSerializer(serializers.ModelSerializer):
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


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "actor", "action", "object_type", "object_id", "reason", "details", "created_at"]


class PauseSerializer(serializers.Serializer):
    portfolio_id = serializers.IntegerField(required=False, allow_null=True, default=None)
    reason = serializers.CharField(required=False, allow_blank=True, default="")


# --- Views ----------------------------------------------------------------------


class SweepViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Sweep.objects.order_by("-slot")
    serializer_class = SweepSerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "cleanup_ops.view_sweep",
        "retrieve": "cleanup_ops.view_sweep",
        "proof": "cleanup_ops.view_sweep",
        "create": "cleanup_ops.add_sweep",
    }

    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        sweep = self.get_object()
        by_state = dict(sweep.jobs.values_list("state").annotate(n=Count("id")).order_by())
        figures = {
            "jobs_by_state": {s: by_state.get(s, 0) for s in JobState.values},
            "rows_deleted": sweep.jobs.aggregate(n=Sum("rows_deleted"))["n"] or 0,
        }
        return Response(SweepDetailSerializer(sweep, context={"figures": figures}).data)

    @extend_schema(
        request=TriggerSerializer,
        responses={
            201: TriggerResultSerializer,
            200: TriggerResultSerializer,
            400: OpenApiResponse(description="malformed or future slot"),
        },
    )
    def create(self, request: Request) -> Response:
        data = TriggerSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        slot = None
        if data.validated_data.get("slot"):
            try:
                slot = slot_parse(data.validated_data["slot"])
            except SlotError as exc:
                raise ValidationError({"slot": str(exc)}) from None
        result = sweep_trigger(slot=slot)
        body = {
            "id": result.sweep.pk,
            "key": result.sweep.key,
            "status": result.sweep.status,
            "created": result.created,
            "jobs_admitted": result.sweep.jobs_admitted,
            "carried_over": result.sweep.carried_over,
        }
        return Response(body, status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)

    @extend_schema(
        parameters=[OpenApiParameter("export", str, enum=["json", "csv"], required=False)],
        responses={200: OpenApiResponse(description="proof of disposition (JSON, or CSV with ?export=csv)")},
    )
    @action(detail=True, methods=["get"])
    def proof(self, request: Request, pk: str | None = None) -> Response | HttpResponse:
        proof = sweep_proof(sweep=self.get_object())
        if request.query_params.get("export") == "csv":
            response = HttpResponse(proof_csv(proof), content_type="text/csv")
            response["Content-Disposition"] = f'attachment; filename="proof-{proof["sweep_id"]}.csv"'
            return response
        return Response(proof)


class JobViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = JobSerializer
    permission_classes = [RolePermission]
    required_perms = {"list": "cleanup_ops.view_cleanupjob", "retrieve": "cleanup_ops.view_cleanupjob"}

    @extend_schema(
        parameters=[
            OpenApiParameter("sweep", int),
            OpenApiParameter("state", str, enum=JobState.values),
            OpenApiParameter("portfolio", int),
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[CleanupJob]:
        qs = CleanupJob.objects.order_by("-id")
        if self.action != "list":
            return qs
        if (sweep := int_param(self.request, "sweep")) is not None:
            qs = qs.filter(sweep_id=sweep)
        if (state := choice_param(self.request, "state", JobState.values)) is not None:
            qs = qs.filter(state=state)
        if (portfolio := int_param(self.request, "portfolio")) is not None:
            qs = qs.filter(portfolio_id=portfolio)
        return qs


class DeadLetterViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = DeadLetterSerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "cleanup_ops.view_deadletter",
        "retrieve": "cleanup_ops.view_deadletter",
        "redrive": "cleanup_ops.redrive_deadletter",
        "dismiss": "cleanup_ops.dismiss_deadletter",
    }

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=DeadLetter.Status.values),
            OpenApiParameter("category", str),
            OpenApiParameter("portfolio", int),
            OpenApiParameter("sweep", int),
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[DeadLetter]:
        qs = DeadLetter.objects.select_related("job").order_by("-id")
        if self.action != "list":
            return qs
        if (status_ := choice_param(self.request, "status", DeadLetter.Status.values)) is not None:
            qs = qs.filter(status=status_)
        if category := self.request.query_params.get("category"):
            qs = qs.filter(category=category)
        if (portfolio := int_param(self.request, "portfolio")) is not None:
            qs = qs.filter(portfolio_id=portfolio)
        if (sweep := int_param(self.request, "sweep")) is not None:
            qs = qs.filter(sweep_id=sweep)
        return qs

    @extend_schema(
        request=ReasonSerializer,
        responses={
            201: JobSerializer,
            400: OpenApiResponse(description="reason missing or shorter than 10 characters"),
            409: OpenApiResponse(description="the dead letter is not open"),
        },
    )
    @action(detail=True, methods=["post"])
    def redrive(self, request: Request, pk: str | None = None) -> Response:
        letter = self.get_object()
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = call_service(
            dead_letter_redrive, letter_id=letter.pk, actor=request.user, reason=data.validated_data["reason"]
        )
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=ReasonSerializer,
        responses={
            200: DeadLetterSerializer,
            400: OpenApiResponse(description="reason missing or shorter than 10 characters"),
            409: OpenApiResponse(description="the dead letter is not open"),
        },
    )
    @action(detail=True, methods=["post"])
    def dismiss(self, request: Request, pk: str | None = None) -> Response:
        letter = self.get_object()
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        letter = call_service(
            dead_letter_dismiss, letter_id=letter.pk, actor=request.user, reason=data.validated_data["reason"]
        )
        return Response(DeadLetterSerializer(letter).data)


class PolicyViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = RetentionPolicy.objects.prefetch_related("versions").order_by("id")
    serializer_class = PolicySerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "retention.view_retentionpolicy",
        "retrieve": "retention.view_retentionpolicy",
        "versions": "retention.add_policyversion",
    }

    @extend_schema(
        request=NewVersionSerializer,
        responses={201: PolicyVersionSerializer, 400: OpenApiResponse(description="invalid retention_days or reason")},
    )
    @action(detail=True, methods=["post"])
    def versions(self, request: Request, pk: str | None = None) -> Response:
        policy = self.get_object()
        data = NewVersionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version = call_service(policy_version_submit, policy=policy, author=request.user, **data.validated_data)
        return Response(PolicyVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class PolicyVersionViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = PolicyVersion.objects.order_by("-id")
    serializer_class = PolicyVersionSerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "retention.view_policyversion",
        "retrieve": "retention.view_policyversion",
        "approve": "retention.approve_policyversion",
        "reject": "retention.approve_policyversion",
    }

    def _review(self, request: Request, fn: Any) -> Response:
        version = self.get_object()
        data = ReviewSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version = call_service(fn, version_id=version.pk, reviewer=request.user, note=data.validated_data["note"])
        return Response(PolicyVersionSerializer(version).data)

    @extend_schema(
        request=ReviewSerializer,
        responses={
            200: PolicyVersionSerializer,
            400: OpenApiResponse(description="not in review"),
            403: OpenApiResponse(description="the author, or a role without the permission"),
        },
    )
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._review(request, policy_version_approve)

    @extend_schema(
        request=ReviewSerializer,
        responses={
            200: PolicyVersionSerializer,
            400: OpenApiResponse(description="not in review, or note missing"),
            403: OpenApiResponse(description="the author, or a role without the permission"),
        },
    )
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._review(request, policy_version_reject)


class LegalHoldViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = LegalHold.objects.order_by("-id")
    serializer_class = LegalHoldSerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "retention.view_legalhold",
        "retrieve": "retention.view_legalhold",
        "create": "retention.add_legalhold",
        "release": "retention.change_legalhold",
    }

    @extend_schema(
        request=LegalHoldSerializer,
        responses={201: LegalHoldSerializer, 400: OpenApiResponse(description="invalid scope or blank reason")},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = LegalHoldSerializer(data=request.data)
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
    def release(self, request: Request, pk: str | None = None) -> Response:
        hold = self.get_object()
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        hold = call_service(
            legal_hold_release, hold_id=hold.pk, released_by=request.user, reason=data.validated_data["reason"]
        )
        return Response(LegalHoldSerializer(hold).data)


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = AuditEventSerializer
    permission_classes = [RolePermission]
    required_perms = {"list": "retention.view_auditevent", "retrieve": "retention.view_auditevent"}

    @extend_schema(
        parameters=[
            OpenApiParameter("action", str),
            OpenApiParameter("object_type", str),
            OpenApiParameter("actor", int),
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[AuditEvent]:
        qs = AuditEvent.objects.order_by("-id")
        if self.action != "list":
            return qs
        if value := self.request.query_params.get("action"):
            qs = qs.filter(action=value)
        if value := self.request.query_params.get("object_type"):
            qs = qs.filter(object_type=value)
        if (actor := int_param(self.request, "actor")) is not None:
            qs = qs.filter(actor_id=actor)
        return qs


class MetricsView(APIView):
    """The overview figures as JSON (the same the console shows)."""

    permission_classes = [RolePermission]
    required_perms = {"get": "cleanup_ops.view_cleanupjob"}

    @extend_schema(responses={200: OpenApiResponse(description="overview figures")})
    def get(self, request: Request) -> Response:
        return Response(overview())


class _PauseSwitchView(APIView):
    permission_classes = [RolePermission]
    service: Any = None
    success = status.HTTP_200_OK

    def post(self, request: Request) -> Response:
        data = PauseSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pause = call_service(type(self).service, actor=request.user, **data.validated_data)
        return Response({"id": pause.pk, "portfolio_id": pause.portfolio_id}, status=self.success)


@extend_schema_view(
    post=extend_schema(
        request=PauseSerializer,
        responses={201: OpenApiResponse(description="paused"), 400: OpenApiResponse(description="invalid")},
    )
)
class PauseView(_PauseSwitchView):
    """Pause the pipeline or one portfolio, with a reason: no new leases until resumed."""

    required_perms = {"post": "cleanup_ops.add_pipelinepause"}
    service = staticmethod(pipeline_pause)
    success = status.HTTP_201_CREATED


@extend_schema_view(
    post=extend_schema(
        request=PauseSerializer,
        responses={200: OpenApiResponse(description="resumed"), 400: OpenApiResponse(description="invalid")},
    )
)
class ResumeView(_PauseSwitchView):
    """Resume the pipeline or one portfolio, with a reason."""

    required_perms = {"post": "cleanup_ops.change_pipelinepause"}
    service = staticmethod(pipeline_resume)
