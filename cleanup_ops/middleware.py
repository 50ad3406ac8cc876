"""Idle sessions end: the console's and the admin's logins.

A logged-in session that has made no request for longer than
``CONSOLE_SESSION_IDLE_SECONDS`` (default 30 minutes) is logged out on its
next request, which then answers as it would to anyone not logged in (the
console and the admin redirect to their login pages; the API answers 403).
A session in use is extended by each request, but never past
``SESSION_COOKIE_AGE`` (Django's, 12 hours in the demo project) from its
login: that cap is held here too, not only by the cookie's expiry, because
every save of the session (this middleware's own stamp among them) moves
the cookie's and the session row's expiry forward.

What counts as use: a request the person made. The console's live refresh
(an htmx request, ``HX-Request: true``) re-fetches figures every few seconds
by itself, so it is checked (an idle session is logged out, and the console
reloads into its login page) but does not extend the session: a tab left
open on the overview does not keep a login alive for ever.

Why not ``SESSION_SAVE_EVERY_REQUEST`` with ``SESSION_COOKIE_AGE`` set to the
idle bound: the cookie would then be extended by every request, the live
refresh's too, and no absolute bound would remain. The stamps are two
integers in the session (``SESSION_KEYS``); the activity stamp is rewritten
at most once per ``STAMP_EVERY_SECONDS`` (a session write per request
would be a database write per request), so "idle" is exact to within that.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponseBase
from django.utils import timezone

# (when the session began, when it was last used), epoch seconds.
STARTED_KEY = "cleanup_ops_session_started"
ACTIVE_KEY = "cleanup_ops_session_active"
SESSION_KEYS = (STARTED_KEY, ACTIVE_KEY)
STAMP_EVERY_SECONDS = 30


def is_automatic(request: HttpRequest) -> bool:
    """A request the page makes by itself (the live refresh), not the person."""
    return request.headers.get("HX-Request") == "true"


def session_expired_reason(*, started: int, active: int, now: int, idle_seconds: int, max_age: int) -> str | None:
    """Why a session with these stamps has ended at ``now``, or None."""
    if now - active > idle_seconds:
        return "idle"
    if now - started > max_age:
        return "age"
    return None


class SessionIdleTimeout:
    """Log out a session idle too long or older than ``SESSION_COOKIE_AGE`` (after
    ``AuthenticationMiddleware``: it needs ``request.user``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and hasattr(request, "session"):
            self._check(request)
        return self.get_response(request)

    def _check(self, request: HttpRequest) -> None:
        session = request.session
        now = int(timezone.now().timestamp())
        started, active = session.get(STARTED_KEY), session.get(ACTIVE_KEY)
        if not isinstance(started, int) or not isinstance(active, int):
            # A session from before this middleware, or just logged in: it starts now.
            session[STARTED_KEY] = session[ACTIVE_KEY] = now
            return
        reason = session_expired_reason(
            started=started,
            active=active,
            now=now,
            idle_seconds=settings.CONSOLE_SESSION_IDLE_SECONDS,
            max_age=settings.SESSION_COOKIE_AGE,
        )
        if reason is not None:
            # Flushes the session (a new key, no data) and makes request.user anonymous.
            logout(request)
            return
        if not is_automatic(request) and now - active >= STAMP_EVERY_SECONDS:
            session[ACTIVE_KEY] = now
