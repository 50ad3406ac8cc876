"""Admin for property managers (policies) and compliance reviewers (review, holds).

Every write goes through ``retention.services``; the admin only renders forms
(``retention.admin_forms``) and confirmation pages. Versions are created from
the policy page ("Submit a new version"), reviewed on a confirmation page that
shows the change against the active version and an impact preview, and never
edited afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from retention.actors import request_actor
from retention.admin_domain import register_demo_domain
from retention.admin_forms import NewVersionForm, PlaceHoldForm, ReleaseForm, ReviewForm, form_errors
from retention.admin_scoping import PortfolioListFilter, PortfolioScopedAdmin
from retention.domain import DISPLAY_FIELD, portfolio_model
from retention.models import (
    AuditEvent,
    LegalHold,
    Membership,
    PolicyVersion,
    RetentionPolicy,
    default_batch_size,
)
from retention.scoping import may_act_in, scope_audit_events
from retention.selectors import policy_version_active, policy_version_impact
from retention.services import (
    ConcurrentApproval,
    legal_hold_place,
    legal_hold_release,
    membership_grant,
    membership_revoke,
    policy_version_approve,
    policy_version_reject,
    policy_version_submit,
)

# What the base class's get_fields and get_list_display return, spelled out:
# django-stubs' own names for them (``_FieldGroups``, ``_ListDisplayT``) are private.
FieldNames = str | list[str] | tuple[str, ...]
FieldGroups = list[FieldNames] | tuple[FieldNames, ...]
Display = str | Callable[[Any], str | bool]
ListDisplay = list[Display] | tuple[Display, ...]

# For the type checker, AuditTrailHistory is the model admin it is mixed into;
# at run time a plain mixin (it comes before ModelAdmin in the bases).
if TYPE_CHECKING:
    _HistoryBase = admin.ModelAdmin[Any]
else:
    _HistoryBase = object


def username_of(user: object) -> str:
    """A user as text, never a link: the user admin answers 403 to everyone
    but the platform's administrators, so a link would be an action the
    reader cannot take (issue 30, item 12)."""
    # The host's user model names its own username field (USERNAME_FIELD).
    get_username = getattr(user, "get_username", None)
    return (str(get_username()) if callable(get_username) else "") or "—"


class AuditTrailHistory(_HistoryBase):
    """A History page that shows the object's audit events and links the
    audit trail. Versions and holds are written through the services, never
    by the admin's own save, so Django's history would always say the object
    "wasn't added via this admin site"; the audit trail is the history."""

    audit_object_type = ""

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict | None = None) -> HttpResponse:
        events = scope_audit_events(
            AuditEvent.objects.filter(object_type=self.audit_object_type, object_id=str(object_id)), request.user
        ).select_related("actor")
        query = f"?object_type__exact={self.audit_object_type}&q={object_id}"
        context = {
            "audit_events": list(events.order_by("created_at", "id")[:200]),
            "audit_url": reverse("admin:retention_auditevent_changelist") + query,
            **(extra_context or {}),
        }
        return super().history_view(request, object_id, context)


class PolicyVersionInline(admin.TabularInline):
    model = PolicyVersion
    # A tuple: both options' declared types take it (a list is invariant).
    fields = ("number", "retention_days", "batch_size", "enabled", "status", "author", "reviewer", "reviewed_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(PortfolioScopedAdmin):
    list_display = ["id", "portfolio", "record_kind", "active_version"]
    list_filter = ["record_kind", ("portfolio", PortfolioListFilter)]
    list_select_related = ["portfolio"]
    inlines = [PolicyVersionInline]
    fields = ["portfolio", "record_kind"]

    def get_readonly_fields(self, request: HttpRequest, obj: RetentionPolicy | None = None) -> list[str]:
        return ["portfolio", "record_kind"] if obj else []

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        policy = self.get_object_or_404(request, object_id)
        # "Submit a new version" only where the reader may submit one (a reviewer may not).
        may_submit = may_act_in(request.user, "retention.add_policyversion", policy.portfolio_id)
        return super().change_view(request, object_id, form_url, {"may_submit": may_submit, **(extra_context or {})})

    @admin.display(description="Active version")
    def active_version(self, obj: RetentionPolicy) -> str:
        version = policy_version_active(policy_id=obj.pk)
        if version is None:
            return "—"
        return f"v{version.number}: {version.retention_days} days, batches of {version.batch_size}" + (
            "" if version.enabled else " (withdrawn)"
        )

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:policy_id>/new-version/",
                self.admin_site.admin_view(self.new_version_view),
                name="retention_retentionpolicy_new_version",
            ),
            *super().get_urls(),
        ]

    def new_version_view(self, request: HttpRequest, policy_id: int) -> HttpResponse:
        # Scope first: another customer's policy is a 404 whatever the role.
        policy = self.get_object_or_404(request, policy_id)
        if not may_act_in(request.user, "retention.add_policyversion", policy.portfolio_id):
            raise PermissionDenied
        active = policy_version_active(policy_id=policy.pk)
        form = NewVersionForm(
            request.POST or None,
            initial={"batch_size": active.batch_size if active else default_batch_size()},
        )
        if request.method == "POST" and form.is_valid():
            try:
                version = policy_version_submit(
                    policy=policy,
                    retention_days=form.cleaned_data["retention_days"],
                    batch_size=form.cleaned_data["batch_size"],
                    enabled=form.cleaned_data["enabled"],
                    author=request_actor(request),
                    reason=form.cleaned_data["reason"],
                )
            except ValidationError as exc:
                form_errors(form, exc)
            else:
                messages.success(request, f"Version {version.number} submitted for review.")
                return HttpResponseRedirect(reverse("admin:retention_policyversion_change", args=[version.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Submit a new version of {policy}",
            "form": form,
            "policy": policy,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/retention/new_version.html", context)


@admin.register(PolicyVersion)
class PolicyVersionAdmin(AuditTrailHistory, PortfolioScopedAdmin):
    portfolio_field = "policy__portfolio_id"
    list_display = [
        "id",
        "policy",
        "number",
        "retention_days",
        "batch_size",
        "enabled",
        "status",
        "author",
        "reviewer",
        "review",
    ]
    list_filter = ["status", "policy__record_kind", ("policy__portfolio", PortfolioListFilter)]
    list_select_related = ["policy__portfolio", "author", "reviewer"]
    # The page of a version is read-only: users as names (not links the
    # reader could not follow), "enabled" in words (the form's help text
    # "Unticked: the policy is withdrawn" beside a ticked box read as a
    # contradiction).
    fields = (
        "policy",
        "number",
        "retention_days",
        "batch_size",
        "policy_state",
        "status",
        "author_name",
        "reason",
        "reviewer_name",
        "reviewed_at",
        "review_note",
        "created_at",
        "submitted_at",
    )
    readonly_fields = fields
    audit_object_type = "policy_version"

    @admin.display(description="Policy")
    def policy_state(self, obj: PolicyVersion) -> str:
        if obj.enabled:
            return "enabled: deletes records past their retention period"
        return "withdrawn: deletes nothing"

    @admin.display(description="Author")
    def author_name(self, obj: PolicyVersion) -> str:
        return username_of(obj.author)

    @admin.display(description="Reviewer")
    def reviewer_name(self, obj: PolicyVersion) -> str:
        return username_of(obj.reviewer)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # new versions come from the policy page, through the service

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # versions are immutable snapshots; review has its own page

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.display(description="Review")
    def review(self, obj: PolicyVersion) -> str:
        if obj.status != PolicyVersion.Status.IN_REVIEW:
            return "—"
        return format_html('<a href="{}">Review…</a>', reverse("admin:retention_policyversion_review", args=[obj.pk]))

    def get_list_display(self, request: HttpRequest) -> ListDisplay:
        """The "Review…" link only where the user may decide (a property
        manager sees that the version awaits a reviewer, not a link to a refusal)."""

        @admin.display(description="Review")
        def review(obj: PolicyVersion) -> str:
            if obj.status == PolicyVersion.Status.IN_REVIEW and not may_act_in(
                request.user, "retention.approve_policyversion", obj.policy.portfolio_id
            ):
                return "awaiting a compliance reviewer"
            if obj.status == PolicyVersion.Status.IN_REVIEW and obj.author_id == request.user.pk:
                return "awaiting another reviewer (you wrote it)"  # four-eyes: not the author
            return self.review(obj)

        return [review if name == "review" else name for name in super().get_list_display(request)]

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:version_id>/review/",
                self.admin_site.admin_view(self.review_view),
                name="retention_policyversion_review",
            ),
            *super().get_urls(),
        ]

    def review_view(self, request: HttpRequest, version_id: int) -> HttpResponse:
        # Scope first: another customer's version is a 404 whatever the role.
        version = self.get_object_or_404(request, version_id)
        if not may_act_in(request.user, "retention.approve_policyversion", version.policy.portfolio_id):
            raise PermissionDenied
        form = ReviewForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            decide = policy_version_approve if form.cleaned_data["decision"] == "approve" else policy_version_reject
            try:
                decide(version_id=version.pk, reviewer=request_actor(request), note=form.cleaned_data["note"])
            except ValidationError as exc:
                form_errors(form, exc)
            except (PermissionDenied, ConcurrentApproval) as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Version {version.number} {form.cleaned_data['decision']}d.")
                return HttpResponseRedirect(reverse("admin:retention_policyversion_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Review {version}",
            "version": version,
            "active": policy_version_active(policy_id=version.policy_id),
            "impact": policy_version_impact(version=version),
            "form": form,
            "is_author": version.author_id == request.user.pk,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/retention/review_version.html", context)


@admin.register(LegalHold)
class LegalHoldAdmin(AuditTrailHistory, PortfolioScopedAdmin):
    form = PlaceHoldForm
    audit_object_type = "legal_hold"
    list_display = ["id", "portfolio", "property", "record_kind", "record_id", "placed_by", "placed_at", "state"]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "record_kind", ("portfolio", PortfolioListFilter)]
    list_select_related = ["portfolio", "property", "placed_by"]
    # Autocomplete, not a raw id: its choices come from the (scoped) property
    # admin, and a raw-id widget would print the name of any id typed into it.
    # The picker offers the chosen portfolio's properties only (its script);
    # an autocomplete when the site model has an admin (the demo's has).
    autocomplete_if_registered = ("property",)

    class Media:
        # After django.jQuery is defined (Django merges media keeping this order).
        js = ["admin/js/vendor/jquery/jquery.min.js", "admin/js/jquery.init.js", "retention/hold_property_picker.js"]

    @admin.display(description="State")
    def state(self, obj: LegalHold) -> str:
        if not obj.is_active:
            return "released"
        return format_html(
            'active · <a href="{}">Release…</a>', reverse("admin:retention_legalhold_release", args=[obj.pk])
        )

    # A hold's page once placed: read-only, users as names (see ``username_of``).
    hold_fields = [
        "portfolio",
        "property",
        "record_kind",
        "record_id",
        "reason",
        "placed_by_name",
        "placed_at",
        "released_by_name",
        "released_at",
        "release_reason",
    ]

    def get_fields(self, request: HttpRequest, obj: LegalHold | None = None) -> FieldGroups:
        return list(self.hold_fields) if obj is not None else super().get_fields(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: LegalHold | None = None) -> list[str]:
        return list(self.hold_fields) if obj is not None else []

    @admin.display(description="Placed by")
    def placed_by_name(self, obj: LegalHold) -> str:
        return username_of(obj.placed_by)

    @admin.display(description="Released by")
    def released_by_name(self, obj: LegalHold) -> str:
        return username_of(obj.released_by)

    def get_list_display(self, request: HttpRequest) -> ListDisplay:
        """ "Release…" only where the reader may release (a manager sees the state alone)."""

        @admin.display(description="State")
        def state(obj: LegalHold) -> str:
            if obj.is_active and not may_act_in(request.user, "retention.change_legalhold", obj.portfolio_id):
                return "active"
            return self.state(obj)

        return [state if name == "state" else name for name in super().get_list_display(request)]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        """A placed hold is never edited: no Save buttons, and a POST changes
        nothing and writes no history row (it said "changed successfully")."""
        hold = self.get_object_or_404(request, object_id)
        if request.method == "POST":
            messages.info(request, "A legal hold is not edited once placed; release it from its own page.")
            return HttpResponseRedirect(request.path)
        context = {
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
            "show_delete": False,
            "may_release": hold.is_active and may_act_in(request.user, "retention.change_legalhold", hold.portfolio_id),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict | None = None) -> HttpResponse:
        try:
            return super().add_view(request, form_url, extra_context)
        except ValidationError:
            # The scope changed between the form's check and the placement under
            # the scope lock (the record was deleted meanwhile): nothing was
            # written. The form checks every rule the service does, so showing
            # it again names the field; should it raise again (the record came
            # and went twice), say so rather than answer 500.
            try:
                return super().add_view(request, form_url, extra_context)
            except ValidationError as exc:
                messages.error(request, " ".join(" ".join(errors) for errors in exc.message_dict.values()))
                return HttpResponseRedirect(request.get_full_path())

    def save_model(self, request: HttpRequest, obj: LegalHold, form: forms.ModelForm, change: bool) -> None:
        if change:
            return  # holds are never edited in place; release has its own page
        hold = legal_hold_place(
            portfolio=obj.portfolio,
            property=obj.property,
            record_kind=obj.record_kind,
            record_id=obj.record_ref,
            reason=obj.reason,
            placed_by=request_actor(request),
        )
        obj.pk = hold.pk

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:hold_id>/release/",
                self.admin_site.admin_view(self.release_view),
                name="retention_legalhold_release",
            ),
            *super().get_urls(),
        ]

    def release_view(self, request: HttpRequest, hold_id: int) -> HttpResponse:
        # Scope first: another customer's hold is a 404 whatever the role.
        hold = self.get_object_or_404(request, hold_id)
        if not may_act_in(request.user, "retention.change_legalhold", hold.portfolio_id):
            raise PermissionDenied
        form = ReleaseForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                legal_hold_release(
                    hold_id=hold.pk, released_by=request_actor(request), reason=form.cleaned_data["reason"]
                )
            except ValidationError as exc:
                form_errors(form, exc)
            else:
                messages.success(request, f"Legal hold {hold.pk} released.")
                return HttpResponseRedirect(reverse("admin:retention_legalhold_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Release {hold}",
            "hold": hold,
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/retention/release_hold.html", context)


@admin.register(AuditEvent)
class AuditEventAdmin(PortfolioScopedAdmin):
    list_display = ["created_at", "actor", "action", "object_type", "object_id", "reason"]
    # Actors of the events the user may see, never the whole user table.
    list_filter = ["action", "object_type", ("actor", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["actor"]
    search_fields = ["object_id"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in AuditEvent._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditEvent]:
        # Events are scoped by the portfolio their details name (scoping.audit_scope_q).
        return scope_audit_events(admin.ModelAdmin.get_queryset(self, request), request.user)


@admin.register(Membership)
class MembershipAdmin(PortfolioScopedAdmin):
    """Who is staff of which portfolio, in which role. Granting and revoking
    are audit events (through the services); a membership is never edited,
    only revoked and granted anew."""

    list_display = ["id", "user", "portfolio", "role", "created_at"]
    list_filter = ["role", ("portfolio", PortfolioListFilter)]
    list_select_related = ["user", "portfolio"]
    # The user model is the host's too (AUTH_USER_MODEL): django.contrib.auth's
    # admin registers auth.User; a host's own user model has the host's admin, or a select.
    autocomplete_if_registered = ("user", "portfolio")

    def get_search_fields(self, request: HttpRequest) -> Any:
        # The customer's name, when the host's customer model has one.
        has_name = DISPLAY_FIELD in {f.name for f in portfolio_model()._meta.concrete_fields}
        user = f"user__{get_user_model().USERNAME_FIELD}"
        return [user, *([f"portfolio__{DISPLAY_FIELD}"] if has_name else [])]

    fields = ["user", "portfolio", "role"]

    def get_readonly_fields(self, request: HttpRequest, obj: Membership | None = None) -> list[str]:
        return ["user", "portfolio", "role"] if obj else []

    def save_model(self, request: HttpRequest, obj: Membership, form: forms.ModelForm, change: bool) -> None:
        if change:
            return
        obj.pk = membership_grant(
            user=obj.user, portfolio=obj.portfolio, role=obj.role, granted_by=request_actor(request)
        ).pk

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        membership_revoke(membership_id=obj.pk, revoked_by=request_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        for pk in queryset.values_list("pk", flat=True):
            membership_revoke(membership_id=pk, revoked_by=request_actor(request))


# The demo domain models' admin, when the demo's app is installed (see retention.admin_domain).
register_demo_domain(admin.site)
