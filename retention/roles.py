"""The four roles as Django groups, the customer roles of memberships, and
the permissions each one implies.

Migrations call ``sync_role_groups`` so that a fresh database has the groups;
a later app adds its own permissions to ``ROLE_PERMISSIONS`` and calls it again
from its own migration.

Two kinds of role (see ``retention.scoping`` for the whole model):

- ``ROLE_PERMISSIONS``: Django groups. ``operator``, ``auditor`` and
  ``compliance_reviewer`` are the platform's own staff and see every
  portfolio (``PLATFORM_GROUPS``); ``property_manager`` is a customer role,
  kept as a group for compatibility: it carries permissions but no portfolio.
- ``MEMBERSHIP_ROLE_PERMISSIONS``: what a ``retention.Membership`` role grants
  a customer's staff, inside the portfolios of their memberships only
  (``retention.backends.MembershipBackend``). Kept apart from the groups on
  purpose: a permission added to a platform group (worker heartbeats,
  django-q2's pages) must not reach customers by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from retention.domain import portfolio_model_label, property_model_label, view_permission
from retention.registry import configured_kinds


def record_kinds_view() -> list[str]:
    """The view permission of every configured record kind's model, from the
    labels in ``RETENTION_RECORD_KINDS`` (known before the registry is ready)."""
    kinds = configured_kinds().values()
    return [view_permission(str(kind["model"])) for kind in kinds if isinstance(kind, Mapping) and kind.get("model")]


# The customer and site models are the host's (retention.domain), and so are
# the record kinds (a permission of an app that is not installed is simply
# not granted).
PROPERTY_VIEW = [
    view_permission(portfolio_model_label()),
    view_permission(property_model_label()),
    *record_kinds_view(),
]
RETENTION_VIEW = [
    "retention.view_retentionpolicy",
    "retention.view_policyversion",
    "retention.view_legalhold",
    "retention.view_auditevent",
]

CLEANUP_VIEW = [
    "cleanup_ops.view_sweep",
    "cleanup_ops.view_cleanupjob",
    "cleanup_ops.view_ledgerentry",
    "cleanup_ops.view_deadletter",
    "cleanup_ops.view_pipelinepause",
    "cleanup_ops.view_workerheartbeat",
]
# django-q2's own admin pages (queued, successful and failed tasks, schedules):
# read-only for operators, who watch the worker clusters.
DJANGO_Q_VIEW = [
    "django_q.view_ormq",
    "django_q.view_success",
    "django_q.view_failure",
    "django_q.view_schedule",
]

# Login lockouts (django-axes): platform staff see them; operators lift one
# by deleting its access attempt (or run ``manage.py axes_reset``).
LOCKOUT_VIEW = ["axes.view_accessattempt", "axes.view_accesslog"]

ROLE_PERMISSIONS: dict[str, list[str]] = {
    "property_manager": [
        *PROPERTY_VIEW,
        *RETENTION_VIEW,
        "retention.add_retentionpolicy",
        "retention.add_policyversion",
    ],
    "compliance_reviewer": [
        *PROPERTY_VIEW,
        *RETENTION_VIEW,
        "retention.approve_policyversion",
        "retention.add_legalhold",
        "retention.change_legalhold",
    ],
    "operator": [
        *PROPERTY_VIEW,
        *RETENTION_VIEW,
        *CLEANUP_VIEW,
        *DJANGO_Q_VIEW,
        *LOCKOUT_VIEW,
        "axes.delete_accessattempt",
        "cleanup_ops.add_sweep",
        "cleanup_ops.redrive_deadletter",
        "cleanup_ops.dismiss_deadletter",
        "cleanup_ops.add_pipelinepause",
        "cleanup_ops.change_pipelinepause",
    ],
    "auditor": [*PROPERTY_VIEW, *RETENTION_VIEW, *CLEANUP_VIEW, *LOCKOUT_VIEW],
}


# Groups whose members see every portfolio.
PLATFORM_GROUPS = frozenset({"operator", "auditor", "compliance_reviewer"})

# What a customer's auditor may read of the pipeline: their own jobs, ledger,
# dead letters and sweep figures (the console and proof exports), nothing of
# the platform itself (pauses, worker heartbeats, django-q2).
CUSTOMER_CLEANUP_VIEW = [
    "cleanup_ops.view_sweep",
    "cleanup_ops.view_cleanupjob",
    "cleanup_ops.view_ledgerentry",
    "cleanup_ops.view_deadletter",
]

MEMBERSHIP_ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "property_manager": frozenset(
        [*PROPERTY_VIEW, *RETENTION_VIEW, "retention.add_retentionpolicy", "retention.add_policyversion"]
    ),
    "compliance_reviewer": frozenset(
        [
            *PROPERTY_VIEW,
            *RETENTION_VIEW,
            "retention.approve_policyversion",
            "retention.add_legalhold",
            "retention.change_legalhold",
        ]
    ),
    "auditor": frozenset([*PROPERTY_VIEW, *RETENTION_VIEW, *CUSTOMER_CLEANUP_VIEW]),
}


def role_groups_grant(Group: Any, Permission: Any, *, using: str) -> None:
    """Each role's group (made if missing) granted its listed permissions that exist:
    the permissions read in one query, each group's granted in one call (five
    migrations run this; a query per permission cost a quarter of a second of
    every migrate)."""
    listed = {dotted for perms in ROLE_PERMISSIONS.values() for dotted in perms}
    found = (
        Permission.objects.using(using)
        .filter(
            content_type__app_label__in={dotted.split(".")[0] for dotted in listed},
            codename__in={dotted.split(".")[1] for dotted in listed},
        )
        .values_list("pk", "content_type__app_label", "codename")
    )
    ids = {f"{app_label}.{codename}": pk for pk, app_label, codename in found}
    for role, perms in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.using(using).get_or_create(name=role)
        group.permissions.add(*sorted(ids[dotted] for dotted in perms if dotted in ids))


def role_groups_grant_on_migrate(*, sender: Any, using: str = "default", plan: Any = None, **kwargs: Any) -> None:
    """``post_migrate``: grant each group its listed permissions that exist,
    on every ``migrate`` — so a record kind added to the settings later,
    which writes no migration of ours, gets its view permission then.

    ``post_migrate`` is sent once per installed app, and each app's
    permissions are created by django.contrib.auth's receiver for that app:
    so this acts once, for the last app, when every permission exists. A
    ``flush`` (which sends it with no plan: the test runner, between
    transactional tests) is left alone. Grants only; never revokes what an
    administrator granted by hand."""
    from django.apps import apps as registry
    from django.contrib.auth.models import Group, Permission

    if plan is None or sender is not list(registry.get_app_configs())[-1]:
        return

    role_groups_grant(Group, Permission, using=using)


def sync_role_groups(apps: Any, schema_editor: Any = None) -> None:
    """Create the groups and grant the listed permissions (idempotent)."""
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after *all* migrations ran; create them
    # now so a data migration can grant them: those of the apps a role is granted
    # something of, the others are not needed yet. create_permissions skips an app
    # without a models module, which a migration's app stubs lack: each gets one
    # for the call, and what it had back after it (with the project's own
    # registry, None would switch off every later post_migrate of the app).
    granted_apps = {dotted.split(".")[0] for perms in ROLE_PERMISSIONS.values() for dotted in perms}
    for app_config in apps.get_app_configs():
        if app_config.label not in granted_apps:
            continue
        had = getattr(app_config, "models_module", None)
        app_config.models_module = had or True
        try:
            create_permissions(app_config, verbosity=0, apps=apps)
        finally:
            app_config.models_module = had

    using = schema_editor.connection.alias if schema_editor is not None else "default"
    role_groups_grant(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"), using=using)
