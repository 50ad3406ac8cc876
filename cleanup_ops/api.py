"""REST API under ``/api/v1/`` (DRF; token and session auth; paginated).

The pipeline's endpoints: sweeps, jobs, dead letters, metrics, pause/resume.
Retention's (policies, versions, holds, audit events) are in ``retention.api``.

Views are thin: they check the role (``RolePermission`` maps each action to a
Django permission), see only the portfolios where the user holds that
permission (``TenantScoped`` for jobs and letters; sweeps, proofs and metrics
count those portfolios only, see ``cleanup_ops.selectors``), validate input
with a serializer (``cleanup_ops.apiserializers``: output serializers are
read-only and each action's form in the browsable API is its input
serializer, ``get_serializer_class``), call a service and render the result.
Service errors map to HTTP: ``ValidationError`` → 400, ``PermissionDenied``
→ 403, ``DeadLetterNotOpen`` and ``PartitionBusy`` → 409. The shared plumbing is in
``retention.apiutils``; the router is wired in ``cleanup_ops/urls.py``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.db.models import Count, QuerySet, Sum
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from cleanup_ops.apiserializers import (
    BulkLetterDecisionSerializer,
    BulkLetterResultSerializer,
    DeadLetterSerializer,
    JobActionResultSerializer,
    JobSerializer,
    PauseResultSerializer,
    PauseSerializer,
    SweepDetailSerializer,
    SweepSerializer,
    TriggerResultSerializer,
    TriggerSerializer,
)
from cleanup_ops.console_selectors import JobFilter
from cleanup_ops.console_selectors.overview import overview
from cleanup_ops.metrics import timed_trigger
from cleanup_ops.models import CleanupJob, DeadLetter, JobState, Sweep
from cleanup_ops.proof import PROOF_FORMATS, proof_csv_sign, proof_sign, sweep_proof
from cleanup_ops.proof_keys import ProofKeyMissing, proof_key_set
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import (
    JOB_ACTION_PERMISSION,
    DeadLetterNotOpen,
    Decision,
    JobAction,
    PartitionBusy,
    dead_letter_dismiss,
    dead_letter_redrive,
    dead_letters_decide,
    jobs_act,
    operator_reason,
    pipeline_pause,
    pipeline_resume,
)
from cleanup_ops.schedule import SlotError, slot_parse, sweep_trigger
from cleanup_ops.selectors import (
    DeadLetterFilter,
    dead_letter_filter_parse,
    selection_changed,
    selection_digest,
    selection_ids,
    sweeps_seen,
)
from retention import apiutils
from retention.apiutils import (
    ID_PATH_PATTERN,
    ID_SCHEMA,
    Conflict,
    ReasonSerializer,
    RolePermission,
    TenantScoped,
    choice_param,
    filter_errors_as_400,
    int_param,
    key_schema,
    portfolio_param,
)
from retention.domain import portfolio_model
from retention.filters import MAX_AGE_HOURS
from retention.scoping import may_act_in, portfolio_ids_q, portfolio_ids_where, scope_queryset

SWEEP_VIEW = "cleanup_ops.view_sweep"
# A portfolio's key in a query string: the customer model's own key type.
PORTFOLIO_KEY_SCHEMA = key_schema(portfolio_model())
JOB_VIEW = "cleanup_ops.view_cleanupjob"


def call_service(fn: Any, **kwargs: Any) -> Any:
    """``retention.apiutils.call_service``, plus ``DeadLetterNotOpen`` and ``PartitionBusy`` → 409."""
    try:
        return apiutils.call_service(fn, **kwargs)
    except (DeadLetterNotOpen, PartitionBusy) as exc:
        raise Conflict(str(exc)) from None


# --- Views ----------------------------------------------------------------------


class SeenPagination(PageNumberPagination):
    """A page of the list, plus ``seen``: the digest of every row the filter
    matches, all pages (``selectors.selection_digest``, the console's
    confirmation pages' digest). A bulk decision by the same filter sends it
    back, so it acts only on the set the caller listed: a count alone lets a
    letter that appeared since be decided unseen. One more query (the ids)."""

    seen = ""

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> Any:
        self.seen = selection_digest(selection_ids(queryset))
        return super().paginate_queryset(queryset, request, view)

    def get_paginated_response(self, data: Any) -> Response:
        response = super().get_paginated_response(data)
        response.data["seen"] = self.seen
        return response

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        out = super().get_paginated_response_schema(schema)
        out["properties"]["seen"] = {
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": "sha256 of the ids of every letter matched (all pages), sorted and comma-joined;"
            " send it back as a bulk decision's `seen` (list with status=open and the bulk's filter)",
        }
        out["required"] = [*out["required"], "seen"]
        return out


class SweepViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    lookup_value_regex = ID_PATH_PATTERN
    queryset = Sweep.objects.order_by("-slot")
    serializer_class = SweepSerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": "cleanup_ops.view_sweep",
        "retrieve": "cleanup_ops.view_sweep",
        "proof": "cleanup_ops.view_sweep",
        "create": "cleanup_ops.add_sweep",
    }

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return TriggerSerializer if self.action == "create" else SweepSerializer

    def get_queryset(self) -> QuerySet[Sweep]:
        return sweeps_seen(portfolio_ids=portfolio_ids_where(self.request.user, SWEEP_VIEW))

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        # The trigger (POST on the list route) is timed whole, authentication
        # and refusals included: that is the latency its caller sees.
        if request.method == "POST" and not kwargs:
            return timed_trigger(lambda: super(SweepViewSet, self).dispatch(request, *args, **kwargs))
        return super().dispatch(request, *args, **kwargs)

    def retrieve(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        sweep = self.get_object()
        jobs = sweep.jobs.filter(portfolio_ids_q(portfolio_ids_where(request.user, SWEEP_VIEW)))
        by_state = dict(jobs.values_list("state").annotate(n=Count("id")).order_by())
        figures = {
            "jobs_by_state": {s: by_state.get(s, 0) for s in JobState.values},
            "rows_deleted": jobs.aggregate(n=Sum("rows_deleted"))["n"] or 0,
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
    def create(self, request: Request, **kwargs: Any) -> Response:
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
        parameters=[OpenApiParameter("export", str, enum=list(PROOF_FORMATS), required=False)],
        responses={
            (200, "application/json"): OpenApiResponse(
                OpenApiTypes.OBJECT,
                description="proof of disposition, signed (JSON, or CSV with ?export=csv); "
                "verify it with the keys at /api/v1/proof-keys/",
            ),
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="the signed proof as CSV (?export=csv)"),
            400: OpenApiResponse(description="export is neither csv nor json"),
            503: OpenApiResponse(description="no proof signing key is configured (RETENTION_PROOF_SIGNING_KEY)"),
        },
    )
    @action(detail=True, methods=["get"])
    def proof(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response | HttpResponse:
        export = choice_param(request, "export", list(PROOF_FORMATS)) or "json"
        proof = sweep_proof(sweep=self.get_object(), portfolio_ids=portfolio_ids_where(request.user, SWEEP_VIEW))
        try:
            if export == "csv":
                response = HttpResponse(proof_csv_sign(proof=proof), content_type="text/csv")
                response["Content-Disposition"] = f'attachment; filename="proof-{proof["sweep_id"]}.csv"'
                return response
            return Response(proof_sign(proof=proof))
        except ProofKeyMissing as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_503_SERVICE_UNAVAILABLE)


class JobViewSet(TenantScoped, viewsets.ReadOnlyModelViewSet):
    """Jobs; ``run-now`` and ``cancel`` act on one pending job with a reason
    (``recovery.operator.jobs_act``, the console's service): 409 when the job
    is no longer pending, 403 without the action's role in its portfolio,
    404 for another customer's job as for a missing one."""

    lookup_value_regex = ID_PATH_PATTERN
    serializer_class = JobSerializer
    permission_classes = [RolePermission]
    required_perms = {
        "list": JOB_VIEW,
        "retrieve": JOB_VIEW,
        "run_now": JOB_ACTION_PERMISSION[JobAction.RUN_NOW],
        "cancel": JOB_ACTION_PERMISSION[JobAction.CANCEL],
    }

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return ReasonSerializer if self.action in {"run_now", "cancel"} else JobSerializer

    def _act(self, request: Request, action: JobAction) -> Response:
        job = self.get_object()
        if not may_act_in(request.user, JOB_ACTION_PERMISSION[action], job.portfolio_id):
            raise PermissionDenied(f"You may not {action.label.lower()} jobs of this portfolio.")
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        done = call_service(
            jobs_act,
            action=action,
            actor=request.user,
            reason=data.validated_data["reason"],
            job_filter=JobFilter(job_ids=(job.pk,)),
        )
        if not done.jobs:
            raise Conflict(f"job {job.pk} is {job.get_state_display().lower()}, not pending.")
        job.refresh_from_db()
        return Response({"job": JobSerializer(job).data, "dead_letter": done.letters[0] if done.letters else None})

    @extend_schema(
        request=ReasonSerializer,
        responses={
            200: JobActionResultSerializer,
            400: OpenApiResponse(description="reason missing or too short"),
            409: OpenApiResponse(description="the job is not pending"),
        },
    )
    @action(detail=True, methods=["post"], url_path="run-now")
    def run_now(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return self._act(request, JobAction.RUN_NOW)

    @extend_schema(
        request=ReasonSerializer,
        responses={
            200: JobActionResultSerializer,
            400: OpenApiResponse(description="reason missing or too short"),
            409: OpenApiResponse(description="the job is not pending"),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return self._act(request, JobAction.CANCEL)

    @extend_schema(
        parameters=[
            OpenApiParameter("sweep", ID_SCHEMA),
            OpenApiParameter("state", str, enum=JobState.values),
            OpenApiParameter("portfolio", PORTFOLIO_KEY_SCHEMA),
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
        if (portfolio := portfolio_param(self.request)) is not None:
            qs = qs.filter(portfolio_id=portfolio)
        return qs


class DeadLetterViewSet(TenantScoped, viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = ID_PATH_PATTERN
    serializer_class = DeadLetterSerializer
    pagination_class = SeenPagination
    permission_classes = [RolePermission]
    required_perms = {
        "list": "cleanup_ops.view_deadletter",
        "retrieve": "cleanup_ops.view_deadletter",
        "redrive": "cleanup_ops.redrive_deadletter",
        "dismiss": "cleanup_ops.dismiss_deadletter",
        # The operation's own permission is checked in ``bulk`` (it is in the body).
        "bulk": "cleanup_ops.view_deadletter",
    }

    def get_serializer_class(self) -> type[serializers.Serializer]:
        if self.action == "bulk":
            return BulkLetterDecisionSerializer
        return ReasonSerializer if self.action in {"redrive", "dismiss"} else DeadLetterSerializer

    @extend_schema(
        request=BulkLetterDecisionSerializer,
        responses={
            200: BulkLetterResultSerializer,
            400: OpenApiResponse(description="invalid ids, filter or reason"),
            403: OpenApiResponse(description="no permission for the operation"),
            409: OpenApiResponse(
                description="the filter now matches other open letters than the caller listed: another number"
                " (`expected`) or another set (`seen`); the body names that field, nothing is decided"
            ),
        },
    )
    @action(detail=False, methods=["post"])
    def bulk(self, request: Request, **kwargs: Any) -> Response:
        """Redrive or dismiss many letters with one reason: the inbox's bulk
        decision (one audit event per letter). Only letters of portfolios
        where the caller holds the operation's permission are decided; an id
        of any other letter is reported in ``not_found``, like an id that
        does not exist."""
        data = BulkLetterDecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        decision = Decision(data.validated_data["operation"])
        perm = f"cleanup_ops.{decision}_deadletter"
        if not request.user.has_perm(perm):
            raise PermissionDenied(f"You may not {decision} dead letters.")
        if "letter_ids" in data.validated_data:
            asked = sorted(set(data.validated_data["letter_ids"]))
            matching = scope_queryset(DeadLetter.objects.filter(pk__in=asked), request.user, perm=perm)
        else:
            with filter_errors_as_400():
                parsed = dead_letter_filter_parse(data.validated_data["filter"], strict=True)
            letter_filter = replace(parsed, status=DeadLetter.Status.OPEN)
            matching = scope_queryset(
                DeadLetter.objects.filter(letter_filter.q(now=timezone.now())), request.user, perm=perm
            )
            asked = []
        found = dict(matching.values_list("id", "status"))
        if "filter" in data.validated_data:
            changed = selection_changed(
                seen=data.validated_data["seen"],
                ids=sorted(found),
                expected=data.validated_data["expected"],
                noun="open letters",
                since="they were listed",
            )
            if changed is not None:
                raise Conflict({changed.field: f"{changed.message} Nothing was decided."})
        open_ids = tuple(sorted(i for i, s in found.items() if s == DeadLetter.Status.OPEN))
        decided: list[DeadLetter] = []
        jobs: list[CleanupJob] = []
        failed: list[Any] = []
        if open_ids:
            decided, jobs, failed = call_service(
                dead_letters_decide,
                decision=decision,
                actor=request.user,
                reason=data.validated_data["reason"],
                letter_filter=DeadLetterFilter(letter_ids=open_ids),
            )
        else:
            # Nothing to decide, but a reason that would be refused is still refused.
            call_service(operator_reason, reason=data.validated_data["reason"])
        decided_ids = {letter.pk for letter in decided}
        failed_ids = {failure.letter_id for failure in failed}
        body = {
            "decided": sorted(decided_ids),
            "jobs": sorted(job.pk for job in jobs),
            "failed": [
                {"letter_id": f.letter_id, "error": f.error_class, "open_job_id": f.open_job_id} for f in failed
            ],
            "not_open": sorted(set(found) - decided_ids - failed_ids),
            "not_found": [i for i in asked if i not in found],
        }
        return Response(body)

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=DeadLetter.Status.values),
            OpenApiParameter("category", str, enum=FailureCategory.values),
            OpenApiParameter("older_than_hours", {"type": "integer", "minimum": 0, "maximum": MAX_AGE_HOURS}),
            OpenApiParameter(
                "http_status",
                {"type": "integer", "minimum": 0, "maximum": 599},
                description="0 (no HTTP answer) or a status from 100 to 599",
            ),
            OpenApiParameter("portfolio", PORTFOLIO_KEY_SCHEMA),
            OpenApiParameter("sweep", ID_SCHEMA),
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[DeadLetter]:
        qs = DeadLetter.objects.select_related("job").order_by("-id")
        if self.action != "list":
            return qs
        with filter_errors_as_400():
            letter_filter = dead_letter_filter_parse(self.request.query_params, strict=True)
        return qs.filter(letter_filter.q(now=timezone.now()))

    def _decide(self, request: Request, service: Any) -> Any:
        """Redrive and dismiss alike: the letter (404 if not visible), a reason, the service."""
        letter = self.get_object()
        if not may_act_in(request.user, self.required_perms[self.action], letter.portfolio_id):
            raise PermissionDenied("You may not decide dead letters of this portfolio.")
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return call_service(service, letter_id=letter.pk, actor=request.user, reason=data.validated_data["reason"])

    @extend_schema(
        request=ReasonSerializer,
        responses={
            201: JobSerializer,
            400: OpenApiResponse(description="reason missing or shorter than 10 characters"),
            409: OpenApiResponse(description="the dead letter is not open"),
        },
    )
    @action(detail=True, methods=["post"])
    def redrive(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        job = self._decide(request, dead_letter_redrive)
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
    def dismiss(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return Response(DeadLetterSerializer(self._decide(request, dead_letter_dismiss)).data)


class MetricsView(APIView):
    """The overview figures as JSON (the same the console shows)."""

    permission_classes = [RolePermission]
    required_perms = {"get": JOB_VIEW}

    @extend_schema(responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="overview figures")})
    def get(self, request: Request) -> Response:
        return Response(overview(portfolio_ids=portfolio_ids_where(request.user, JOB_VIEW)))


class ProofKeysView(APIView):
    """The public keys proofs of disposition are signed with, by key id (the current one
    first, then those rotated out): what an auditor gives ``cleanup_proof_verify
    --public-key``. Public keys only, so anyone may read them, signed in or not."""

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []

    @extend_schema(
        responses={
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="the proof signing public keys (key set JSON)")
        }
    )
    def get(self, request: Request) -> Response:
        return Response(proof_key_set())


class _PauseSwitchView(APIView):
    permission_classes = [RolePermission]
    service: Any = None
    success: int = status.HTTP_200_OK
    #: Each subclass declares its one permission (RolePermission's map).
    required_perms: dict[str, str]

    def post(self, request: Request) -> Response:
        data = PauseSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        portfolio_id = data.validated_data["portfolio_id"]
        perm = self.required_perms["post"]
        if portfolio_id is not None and not may_act_in(request.user, perm, portfolio_id):
            raise ValidationError({"portfolio_id": f"no portfolio with id {portfolio_id}"})
        pause = call_service(type(self).service, actor=request.user, **data.validated_data)
        return Response({"id": pause.pk, "portfolio_id": pause.portfolio_id}, status=self.success)


@extend_schema_view(
    post=extend_schema(
        request=PauseSerializer,
        responses={
            201: OpenApiResponse(PauseResultSerializer, description="paused"),
            400: OpenApiResponse(description="invalid"),
        },
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
        responses={
            200: OpenApiResponse(PauseResultSerializer, description="resumed"),
            400: OpenApiResponse(description="invalid"),
        },
    )
)
class ResumeView(_PauseSwitchView):
    """Resume the pipeline or one portfolio, with a reason."""

    required_perms = {"post": "cleanup_ops.change_pipelinepause"}
    service = staticmethod(pipeline_resume)
