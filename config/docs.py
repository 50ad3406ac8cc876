"""The API docs pages (Swagger UI, Redoc) as drf-spectacular serves them, plus
an ``OPTIONS`` answer: theirs renders DRF's metadata through an HTML template
renderer that has no template for it (a 500)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView
from rest_framework.request import Request


class _Options:
    def options(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponse:
        response = HttpResponse(status=200)
        response["Allow"] = "GET, HEAD, OPTIONS"
        return response


class SwaggerView(_Options, SpectacularSwaggerView):
    pass


class RedocView(_Options, SpectacularRedocView):
    pass
