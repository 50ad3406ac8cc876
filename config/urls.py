"""The demo project's routes: the admin, and the product at the root.

The product's routes are one ``include("cleanup_ops.urls")``, as in any host
project (there under a prefix of the host's choosing); see that module.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="console:overview", permanent=False)),
    path("admin/", admin.site.urls),
    path("", include("cleanup_ops.urls")),
]
