"""Refuse control characters in request parameters, before any view runs.

Every query-string parameter, and every field of a form-encoded body, is
checked with ``retention.inputs.has_control_characters`` (names and values):
a NUL or another control character other than tab, line feed and carriage
return answers 400 naming the parameter, whatever the route — console,
admin (search ``q``, autocomplete ``term``, filters), API (as JSON,
``{"<parameter>": ["…"]}``, like its other 400s), login. Without
this a NUL reaches PostgreSQL, which refuses it in text with an error (a
500), or SQLite, which stores it. JSON bodies are checked by the API's
serializers (``retention.apiutils.FreeTextField``).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse, QueryDict
from django.urls import NoReverseMatch, reverse

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
    """Whether ``path`` is under the API's root (``api-root``, wherever the
    host mounted the product's URLs)."""
    try:
        return path.startswith(reverse("api-root"))
    except NoReverseMatch:  # a project without the product's API
        return False


class RefuseControlCharacters:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        field = control_character_field(request.GET)
        if field is None and request.method == "POST" and request.content_type in FORM_TYPES:
            field = control_character_field(request.POST)
        if field is not None:
            message = "control characters (such as NUL) are not allowed."
            if _is_api(request.path):  # the API's own error shape: {field: [message]}
                return JsonResponse({field: [message]}, status=400)
            return HttpResponseBadRequest(f"{field}: {message}\n", content_type="text/plain")
        return self.get_response(request)
