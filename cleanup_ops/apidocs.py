"""The API docs pages (Swagger UI, Redoc) as drf-spectacular serves them, with:

- the project's Content-Security-Policy (django-csp), widened for these two
  pages only (``DOCS_CSP``), and still without any inline script that lacks
  the request's nonce: Swagger UI's start-up script is a second request to
  the same view (drf-spectacular's split view), Redoc's one-line start-up
  call carries the nonce. It lets the page load only from this host.
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

from csp.constants import NONCE, SELF, UNSAFE_INLINE
from django.http import HttpResponse, HttpResponseBase
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerSplitView
from rest_framework.request import Request

# What these pages add to the project's policy (django-csp's "update": the
# other directives, frame-ancestors 'none' and object-src 'none' among them,
# stay the project's). Inline styles are the pages' own (Swagger's <style>,
# Redoc's styled components, which write <style> elements at run time);
# Redoc's search runs in a blob: worker; both draw data: images and fonts.
# Never 'unsafe-inline' for scripts.
DOCS_CSP: dict[str, list[Any]] = {
    "script-src": [SELF, NONCE, "blob:"],
    "worker-src": [SELF, "blob:"],
    "style-src": [SELF, UNSAFE_INLINE],
    "img-src": [SELF, "data:"],
    "font-src": [SELF, "data:"],
}


# A mixin before a DRF view: its OPTIONS answers a plain HttpResponse, which
# DRF's dispatch takes (its stubs declare a handler's answer a Response only).
class _Options:
    def options(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponse:
        response = HttpResponse(status=200)
        response["Allow"] = "GET, HEAD, OPTIONS"
        return response

    def finalize_response(self, request: Request, response: HttpResponseBase, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]  # a mixin: the class after it in the bases has it
        # What csp.decorators.csp_update sets: csp.middleware.CSPMiddleware merges it.
        setattr(response, "_csp_update", DOCS_CSP)  # noqa: B010 - an attribute django's HttpResponse does not declare
        return response


class SwaggerView(_Options, SpectacularSwaggerSplitView):  # type: ignore[misc]  # DRF takes an HttpResponse too
    # The split view: the page names its start-up script as ``?script=``, the
    # same view answering JavaScript, so the page holds no inline script.
    pass


class RedocView(_Options, SpectacularRedocView):  # type: ignore[misc]  # DRF takes an HttpResponse too
    # drf-spectacular's page without its Google Fonts links, under the app's own name.
    template_name = "cleanup_ops/redoc.html"
