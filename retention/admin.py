"""Admin for property managers (policies) and compliance reviewers (review, holds).

Every write goes through ``retention.services``; the admin only renders forms
and confirmation pages. Versions are created from the policy page ("Submit a
new version"), reviewed on a confirmation page that shows the change against
the active version and an impact preview, and never edited afterwards.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from retention.admin_domain import register_demo_domain
from retention.admin_scoping import PortfolioListFilter, PortfolioScopedAdmin
from retention.domain import DISPLAY_FIELD, portfolio_model
from retention.inputs import MAX_TEXT_LENGTH
from retention.models import (
    MAX_BATCH_SIZE,
    MIN_BATCH_SIZE,
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
    legal_hold_scope_validate,
    membership_grant,
    membership_revoke,
    policy_version_approve,
    policy_version_reject,
    policy_version_submit,
)


def _form_errors(form: forms.Form, exc: ValidationError) -> None:
    for field, errors in exc.message_dict.items():
        form.add_error(field if field in form.fields else None, errors)


class PolicyVersionInline(admin.TabularInline):
    model = PolicyVersion
    fields = ["number", "retention_days", "batch_size", "enabled", "status", "author", "reviewer", "reviewed_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def free_text_field(*, required: bool = True) -> forms.CharField:
    """A reason or note: at most ``MAX_TEXT_LENGTH`` characters (the browser
    stops there too); control characters are refused by the middleware and
    the service."""
    return forms.CharField(required=required, max_length=MAX_TEXT_LENGTH, widget=forms.Textarea(attrs={"rows": 3}))


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


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(PortfolioScopedAdmin):
    list_display = ["id", "portfolio", "record_kind", "active_version"]
    list_filter = ["record_kind", ("portfolio", PortfolioListFilter)]
    list_select_related = ["portfolio"]
    inlines = [PolicyVersionInline]
    fields = ["portfolio", "record_kind"]

    def get_readonly_fields(self, request: HttpRequest, obj: RetentionPolicy | None = None) -> list[str]:
        return ["portfolio", "record_kind"] if obj else []

    @admin.display(description="Active version")
    def active_version(self, obj: RetentionPolicy) -> str:
        version = policy_version_active(policy_id=obj.pk)
        if version is None:
            return "—"
        return f"v{version.number}: {version.retention_days} days, batches of {version.batch_size}" + (
            "" if version.enabled else " (withdrawn)"
        )

    def get_urls(self):  # type: ignore[no-untyped-def]
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
                    author=request.user,
                    reason=form.cleaned_data["reason"],
                )
            except ValidationError as exc:
                _form_errors(form, exc)
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


class ReviewForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    note = free_text_field(required=False)


@admin.register(PolicyVersion)
class PolicyVersionAdmin(PortfolioScopedAdmin):
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
    readonly_fields = [f.name for f in PolicyVersion._meta.fields]

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

    def get_list_display(self, request: HttpRequest):  # type: ignore[no-untyped-def]
        """The "Review…" link only where the user may decide (a property
        manager sees that the version awaits a reviewer, not a link to a refusal)."""

        @admin.display(description="Review")
        def review(obj: PolicyVersion) -> str:
            if obj.status == PolicyVersion.Status.IN_REVIEW and not may_act_in(
                request.user, "retention.approve_policyversion", obj.policy.portfolio_id
            ):
                return "awaiting a compliance reviewer"
            return self.review(obj)

        return [review if name == "review" else name for name in super().get_list_display(request)]

    def get_urls(self):  # type: ignore[no-untyped-def]
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
                decide(version_id=version.pk, reviewer=request.user, note=form.cleaned_data["note"])
            except ValidationError as exc:
                _form_errors(form, exc)
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


class PlaceHoldForm(forms.ModelForm):
    reason = free_text_field()

    class Meta:
        model = LegalHold
        fields = ["portfolio", "property", "record_kind", "record_id", "reason"]

    def clean(self) -> dict[str, object]:
        """The service's scope rules, shown on the form's fields (placing checks them again under its lock)."""
        data = super().clean()
        portfolio = data.get("portfolio")
        if portfolio is not None and not self.errors:
            try:
                legal_hold_scope_validate(
                    portfolio=portfolio,
                    property=data.get("property"),
                    record_kind=data.get("record_kind") or "",
                    record_id=data.get("record_id"),
                )
            except ValidationError as exc:
                _form_errors(self, exc)
        return data


class ReleaseForm(forms.Form):
    reason = free_text_field()


@admin.register(LegalHold)
class LegalHoldAdmin(PortfolioScopedAdmin):
    form = PlaceHoldForm
    list_display = ["id", "portfolio", "property", "record_kind", "record_id", "placed_by", "placed_at", "state"]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "record_kind", ("portfolio", PortfolioListFilter)]
    list_select_related = ["portfolio", "property", "placed_by"]
    # Autocomplete, not a raw id: its choices come from the (scoped) property
    # admin, and a raw-id widget would print the name of any id typed into it.
    autocomplete_if_registered = ("property",)

    @admin.display(description="State")
    def state(self, obj: LegalHold) -> str:
        if not obj.is_active:
            return "released"
        return format_html(
            'active · <a href="{}">Release…</a>', reverse("admin:retention_legalhold_release", args=[obj.pk])
        )

    def get_readonly_fields(self, request: HttpRequest, obj: LegalHold | None = None) -> list[str]:
        if obj is None:
            return []
        return [f.name for f in LegalHold._meta.fields]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict | None = None) -> HttpResponse:
        try:
            return super().add_view(request, form_url, extra_context)
        except ValidationError:
            # The scope changed between the form's check and the placement under
            # the scope lock (the record was deleted meanwhile): nothing was
            # written; show the form again, whose check now names the field.
            return super().add_view(request, form_url, extra_context)

    def save_model(self, request: HttpRequest, obj: LegalHold, form: forms.ModelForm, change: bool) -> None:
        if change:
            return  # holds are never edited in place; release has its own page
        hold = legal_hold_place(
            portfolio=obj.portfolio,
            property=obj.property,
            record_kind=obj.record_kind,
            record_id=obj.record_id,
            reason=obj.reason,
            placed_by=request.user,
        )
        obj.pk = hold.pk

    def get_urls(self):  # type: ignore[no-untyped-def]
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
                legal_hold_release(hold_id=hold.pk, released_by=request.user, reason=form.cleaned_data["reason"])
            except ValidationError as exc:
                _form_errors(form, exc)
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
    search_fields = ["user__username"]
    autocomplete_fields = ["user"]
    autocomplete_if_registered = ("portfolio",)

    def get_search_fields(self, request: HttpRequest) -> Any:
        # The customer's name, when the host's customer model has one.
        has_name = DISPLAY_FIELD in {f.name for f in portfolio_model()._meta.concrete_fields}
        return [*self.search_fields, *([f"portfolio__{DISPLAY_FIELD}"] if has_name else [])]

    fields = ["user", "portfolio", "role"]

    def get_readonly_fields(self, request: HttpRequest, obj: Membership | None = None) -> list[str]:
        return ["user", "portfolio", "role"] if obj else []

    def save_model(self, request: HttpRequest, obj: Membership, form: forms.ModelForm, change: bool) -> None:
        if change:
            return
        obj.pk = membership_grant(user=obj.user, portfolio=obj.portfolio, role=obj.role, granted_by=request.user).pk

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        membership_revoke(membership_id=obj.pk, revoked_by=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        for pk in queryset.values_list("pk", flat=True):
            membership_revoke(membership_id=pk, revoked_by=request.user)


# The demo domain models' admin, when the demo's app is installed (see retention.admin_domain).
register_demo_domain(admin.site)
