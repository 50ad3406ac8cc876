"""Refuse control characters in request parameters, before any view runs.

Every query-string parameter, and every field of a form-encoded body, is
checked with ``retention.inputs.has_control_characters`` (names and values):
a NUL or another control character other than tab, line feed and carriage
return answers 400 naming the parameter, whatever the route — console,
admin (search ``q``, autocomplete ``term``, filters), API (as JSON,
``{"<parameter>": ["…"]}``, like its other 400s), login. Without
this a NUL reaches PostgreSQL, which refuses it in text with an error (a
500). JSON bodies are checked by the API's
serializers (``retention.apiutils.FreeTextField``).

The path is checked too: a control character (``%00``) or a lone surrogate
in it answers 400 naming ``path`` before any view looks it up (an admin
object id ``%00`` reached PostgreSQL, which refuses NUL in text).
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from functools import lru_cache
from urllib.parse import unquote_to_bytes

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse, QueryDict
from django.utils import timezone

from retention.apierrors import under_api
from retention.inputs import has_control_characters

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def control_character_field(params: QueryDict) -> str | None:
    """The first parameter whose name or a value holds a control character."""
    for name, values in params.lists():
        if has_control_characters(name):
            return "parameter name"
        if any(isinstance(value, str) and has_control_characters(value) for value in values):
            return name
    return None


def _is_api(path: str) -> bool:
    """Whether ``path`` is under the API's prefix (``api/``, wherever the host
    mounted the product's URLs; ``retention.apierrors.under_api``): also a path
    no route matches there (``/api/%00``), which is answered as JSON too."""
    return under_api(path)


def path_problem(request: HttpRequest) -> bool:
    """Whether the path holds a control character, a lone surrogate, or bytes
    that are not UTF-8. ``%ED%A0%80`` is how a lone surrogate arrives over
    HTTP; Django keeps bytes that are not UTF-8 percent-encoded in
    ``request.path``, where a view would take them as an id or a name. (No
    route of ours has a literal ``%`` in it, so nothing valid is refused.)"""
    path = request.path
    if has_control_characters(path) or any("\ud800" <= ch <= "\udfff" for ch in path):
        return True
    try:
        unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


class RefuseControlCharacters:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # "path": a control character, a lone surrogate or bytes that are not UTF-8.
        field = "path" if path_problem(request) else None
        field = field or control_character_field(request.GET)
        if field is None and request.method == "POST" and request.content_type in FORM_TYPES:
            field = control_character_field(request.POST)
        if field is not None:
            message = "control characters (such as NUL) are not allowed."
            if _is_api(request.path):  # the API's own error shape: {field: [message]}
                return JsonResponse({field: [message]}, status=400)
            return HttpResponseBadRequest(f"{field}: {message}\n", content_type="text/plain")
        return self.get_response(request)


# --- The viewer's time zone -------------------------------------------------------

# The cookie the console's script (and the admin's, retention/viewer_zone.js)
# sets to the browser's IANA zone, e.g. "America/New_York".
VIEWER_ZONE_COOKIE = "viewer_zone"


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def viewer_zone(request: HttpRequest) -> zoneinfo.ZoneInfo | None:
    """The zone the viewer's browser named, if it is a known IANA zone (the
    cookie is the client's word: anything else is ignored, never looked up)."""
    name = request.COOKIES.get(VIEWER_ZONE_COOKIE, "")
    if not name or len(name) > 64 or name not in _known_zones():
        return None
    return zoneinfo.ZoneInfo(name)


class ViewerTimeZone:
    """Render every time in the viewer's zone, the zone named, in the console
    and the admin alike: Django's current time zone is the browser's, as its
    script reported it in ``viewer_zone``. Without the cookie (the very first
    page, or no script) times stay in ``TIME_ZONE`` (UTC), named as such;
    the formats name the zone either way (``config/formats``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        zone = viewer_zone(request)
        if zone is None:
            timezone.deactivate()
            return self.get_response(request)
        timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
