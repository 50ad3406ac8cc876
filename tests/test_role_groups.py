"""``sync_role_groups`` (retention.roles), which the data migrations run: it makes the
permissions it grants and the role groups, and leaves the app registry it is given as
it found it."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission

from retention.roles import ROLE_PERMISSIONS, sync_role_groups


def granted(group: Group) -> set[str]:
    return {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}


@pytest.mark.django_db
def test_role_groups_are_made_with_every_listed_permission_when_none_exists_yet() -> None:
    Group.objects.all().delete()
    Permission.objects.all().delete()

    sync_role_groups(apps)

    assert set(Group.objects.values_list("name", flat=True)) == set(ROLE_PERMISSIONS)
    for role, perms in ROLE_PERMISSIONS.items():
        assert granted(Group.objects.get(name=role)) == set(perms), role


@pytest.mark.django_db
def test_role_groups_leave_every_apps_models_module_as_they_found_it() -> None:
    """With the project's own registry, an app left without its models module would
    get no ``post_migrate`` again in this process (no reference guard, no permission)."""
    before = {config.label: config.models_module for config in apps.get_app_configs()}

    sync_role_groups(apps)

    assert {config.label: config.models_module for config in apps.get_app_configs()} == before
