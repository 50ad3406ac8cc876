"""Permissions from memberships, for ``user.has_perm``.

A customer's staff member needs no Django group: each of their memberships
grants the permissions of its role (``roles.MEMBERSHIP_ROLE_PERMISSIONS``), so
the admin and ``RolePermission`` let them in. ``has_perm`` answers "somewhere";
*where* is ``retention.scoping``: every queryset is narrowed to the user's
portfolios and every write checks ``scoping.may_act_in`` for the portfolio at
hand. Listed after ``ModelBackend`` in ``AUTHENTICATION_BACKENDS``; it never
authenticates anyone.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import BaseBackend

from retention.models import Membership
from retention.roles import MEMBERSHIP_ROLE_PERMISSIONS

MEMBERSHIP_PERM_CACHE = "_membership_perm_cache"


class MembershipBackend(BaseBackend):
    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if obj is not None or not user_obj.is_active or user_obj.is_anonymous:
            return set()
        cached = getattr(user_obj, MEMBERSHIP_PERM_CACHE, None)
        if cached is None:
            roles = set(Membership.objects.filter(user_id=user_obj.pk).values_list("role", flat=True))
            cached = set().union(*(MEMBERSHIP_ROLE_PERMISSIONS.get(role, frozenset()) for role in roles))
            setattr(user_obj, MEMBERSHIP_PERM_CACHE, cached)
        return cached

    def has_module_perms(self, user_obj: Any, app_label: str) -> bool:
        return any(perm.startswith(f"{app_label}.") for perm in self.get_all_permissions(user_obj))
