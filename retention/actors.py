"""Who acts: the user type the services take, and the signed-in user of a request.

Every service that records who did something (an author, a reviewer, the
user who placed a hold or paused the pipeline) stores that user in a foreign
key to the ``AUTH_USER_MODEL`` setting and asks it ``has_perm``. ``Actor`` is
that model as the type checker sees it: django-stubs types those keys with
the model the checked project's ``AUTH_USER_MODEL`` names (the demo's is
``auth.User``). At run time it is only a name for annotations; a host's own
user model (with Django's permission methods) works the same.

``request_actor`` is ``request.user`` in a view that runs only for a signed-in
user (``login_required``, the admin site's staff check, DRF's
``IsAuthenticated``): there it is never ``AnonymousUser``, which the request's
declared type (``User | AnonymousUser``) cannot say.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.http import HttpRequest

if TYPE_CHECKING:
    from django.contrib.auth.models import User as Actor
else:
    from django.contrib.auth.base_user import AbstractBaseUser as Actor

__all__ = ["Actor", "request_actor"]


def request_actor(request: HttpRequest) -> Actor:
    """The signed-in user of a view that requires sign-in (see the module docstring)."""
    # A cast, not a check: the sign-in requirement already ran, and an
    # isinstance test against auth.User would refuse a host's own user model.
    return cast("Actor", request.user)
