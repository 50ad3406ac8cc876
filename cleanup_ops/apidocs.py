"""The API docs pages (Swagger UI, Redoc) as drf-spectacular serves them, with:

- a Content-Security-Policy that lets the page load only from this host.
  The pages name no external URL (``cleanup_ops/templates/cleanup_ops/redoc.html``
  drops the Google Fonts links; Swagger's validator badge is off), but
  Redoc's bundle itself always renders the Redocly logo from
  ``cdn.redoc.ly``; the policy keeps the browser from asking for it, so the
  offline docs make no request outside the host at all;
- an ``OPTIONS`` answer: theirs renders DRF's metadata through an HTML
  template renderer that has no template for it (a 500).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse, HttpResponseBase
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView
from rest_framework.request import Request

# Inline scripts and styles are the pages' own (Swagger's start-up script,
# Redoc's styled components); Redoc's search runs in a blob: worker.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' blob:; worker-src 'self' blob:; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)


# A mixin before a DRF view: its OPTIONS answers a plain HttpResponse, which
# DRF's dispatch takes (its stubs declare a handler's answer a Response only).
class _Options:
    def options(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponse:
        response = HttpResponse(status=200)
        response["Allow"] = "GET, HEAD, OPTIONS"
        return response

    def finalize_response(self, request: Request, response: HttpResponseBase, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]  # a mixin: the class after it in the bases has it
        response["Content-Security-Policy"] = DOCS_CSP
        return response


class SwaggerView(_Options, SpectacularSwaggerView):  # type: ignore[misc]  # DRF takes an HttpResponse too
    pass


class RedocView(_Options, SpectacularRedocView):  # type: ignore[misc]  # DRF takes an HttpResponse too
    # drf-spectacular's page without its Google Fonts links, under the app's own name.
    template_name = "cleanup_ops/redoc.html"
