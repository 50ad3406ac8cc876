"""Every answer under the API's prefix (``api/``) is JSON, errors included.

Three pieces, because errors arise at three levels and Django's own
``handler404``/``handler500`` belong to the host project:

- ``api_not_found``: the last route of ``cleanup_ops.urls``, under ``api/``.
  A path the router does not match (``/api/v1/jobs/abc/``, an id of twenty
  digits, ``/api/v2/``) reaches it and answers a JSON 404, in any host
  project that includes the product's URLs, whatever its settings.
- ``ApiJsonErrors``: a middleware that gives an error answered by Django
  rather than by a DRF view — a 500 from an exception, a 400 from a
  ``SuspiciousOperation``, a 403 from the CSRF check, a 413 — the same JSON
  body, with the status and headers (``Allow``, ``Retry-After``) kept. It
  also answers two faults of the request line itself before any view runs:
  a path and query string longer than ``MAX_URI_LENGTH`` (414, what a proxy
  would refuse anyway, so the API's 414 is JSON too), and a query parameter
  given twice or empty (400 naming it: ``query_problem``).
- ``api_exception_handler``: DRF's handler, whose body is always an object
  (a bare list, ``ValidationError("…")`` raised outside a serializer,
  becomes ``{"detail": [...]}``).

The body (``ERROR_SCHEMA``, documented on every operation by
``cleanup_ops.apischema``) is a JSON object: ``detail`` for an error of the
request as a whole, else one key per field or query parameter, each with
its messages. No message quotes the request's body.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, QueryDict
from django.urls import NoReverseMatch, Resolver404, resolve, reverse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

#: The name of the catch-all route under ``api/`` (``cleanup_ops.urls``).
NOT_FOUND_ROUTE = "api-not-found"
#: The longest path plus query string the API reads (bytes of the request
#: line's target); longer is a 414. Proxies refuse about this much already
#: (nginx's default buffer is 8 KiB); no parameter of ours comes near it.
MAX_URI_LENGTH = 8192

# A message's value: a string, a list of them, or (a list's or a dict's
# items, e.g. ``letter_ids.0``) an object of such values.
_MESSAGES: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}},
        {"type": "object", "additionalProperties": True},
    ]
}
#: The body of every error answer of the API (OpenAPI 3.0 schema object).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An error: `detail` for the request as a whole, or one key per field or query parameter"
    " naming it, each with its messages.",
    "properties": {"detail": _MESSAGES},
    "additionalProperties": _MESSAGES,
    "minProperties": 1,
}


def api_prefix() -> str | None:
    """The path every API route starts with (``/api/``, or ``/ops/api/`` in a
    host that includes the product under ``ops/``); None without the product's URLs."""
    try:
        return reverse(NOT_FOUND_ROUTE, kwargs={"rest": ""})
    except NoReverseMatch:
        return None


def under_api(path: str) -> bool:
    prefix = api_prefix()
    return prefix is not None and path.startswith(prefix)


def error_response(status: int, detail: str | None = None) -> JsonResponse:
    """``{"detail": ...}`` with ``status``; the message defaults to the status's phrase."""
    return JsonResponse({"detail": detail or _phrase(status)}, status=status)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


@csrf_exempt  # an unknown path is a 404 for every method, never the CSRF check's HTML 403
def api_not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    return error_response(404, "Not found: no route of the API matches this path.")


# Headers of a replaced answer that describe the old body, not the answer.
_BODY_HEADERS = frozenset({"content-type", "content-length", "content-encoding", "content-disposition"})


class ApiJsonErrors:
    """Under the API's prefix, an error answer that is not JSON is answered as
    JSON (see the module). DRF's JSON answers and the browsable API's page a
    browser asked for are left as they are."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not under_api(request.path):
            return self.get_response(request)
        if len(request.get_full_path()) > MAX_URI_LENGTH:
            return error_response(414, f"URI Too Long: the path and query string exceed {MAX_URI_LENGTH} bytes.")
        problem = None if _is_docs_page(request) else query_problem(request.GET)
        if problem is not None:
            name, message = problem
            return JsonResponse({name: [message]}, status=400)
        response = self.get_response(request)
        if response.status_code < 400 or _is_json(response) or _is_browsable(response):
            return response
        data = getattr(response, "data", None) if isinstance(response, Response) else None
        if isinstance(data, dict) and data:
            # A DRF error rendered otherwise (the schema view's YAML): the same body, as JSON.
            replacement = JsonResponse(data, status=response.status_code)
        else:
            replacement = error_response(response.status_code)
        for name, value in response.items():
            if name.lower() not in _BODY_HEADERS:
                replacement[name] = value
        replacement.cookies = response.cookies
        return replacement


#: The API's HTML docs pages (``cleanup_ops.urls``): pages, not operations. The
#: Swagger page loads its own script as ``?script=``, an empty parameter on purpose.
DOCS_PAGES = frozenset({"api-docs", "api-redoc"})


def _is_docs_page(request: HttpRequest) -> bool:
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return False
    return match.url_name in DOCS_PAGES


def query_problem(params: QueryDict) -> tuple[str, str] | None:
    """The first query parameter given more than once or empty, and why.
    Every parameter of the API takes one value: DRF and the filters read the
    last of several (``?page=1&page=9`` would be page 9) and take an empty one
    as absent (``?export=`` would be JSON), so either is a 400 naming it."""
    for name, values in params.lists():
        if len(values) > 1:
            return name, f"{name} is given {len(values)} times; give it once."
        if values == [""]:
            return name, f"{name} is empty; give a value or leave the parameter out."
    return None


def _is_browsable(response: HttpResponseBase) -> bool:
    """The browsable API's page (``API_BROWSABLE``), which a browser asked for by its ``Accept``."""
    renderer = getattr(response, "accepted_renderer", None)
    return isinstance(response, Response) and renderer is not None and renderer.format == "api"


def _is_json(response: HttpResponseBase) -> bool:
    return response.get("Content-Type", "").split(";")[0].strip() == "application/json"


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, with the body always an object (``ERROR_SCHEMA``). An
    exception DRF does not handle stays unhandled: Django logs it and answers
    500, which ``ApiJsonErrors`` makes JSON."""
    response = drf_exception_handler(exc, context)
    if response is not None and not isinstance(response.data, dict):
        response.data = {"detail": response.data}
    return response
