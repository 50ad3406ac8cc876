"""A host project's URLs as docs/adopting.md writes them: the product under ``ops/``."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/", include("cleanup_ops.urls")),
]
