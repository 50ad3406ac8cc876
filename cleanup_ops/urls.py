"""Every route of the product, for one ``include()`` under any prefix.

A host project adds ``path("ops/", include("cleanup_ops.urls"))`` (the demo
project, ``config/urls.py``, includes it at the root): the console under
``console/``, its login and logout pages, the REST API (the pipeline's and
retention's viewsets on one router, the trigger endpoint ``api/v1/sweeps/``,
the schema and its docs pages) under ``api/v1/``, and the Prometheus exporter
at ``metrics``. Any other path under ``api/`` is a JSON 404 (``api-not-found``,
last). Nothing in the code or the templates writes a path: every link is
``reverse()`` or ``{% url %}`` of the names below, so the prefix is the
host's choice. The admin stays the host's (``admin.site.urls``).
"""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from cleanup_ops import api, prometheus, tokens_api
from cleanup_ops.apidocs import RedocView, SwaggerView
from retention import api as retention_api
from retention.apierrors import NOT_FOUND_ROUTE, api_not_found

# One router for api/v1/ (one API root): the pipeline's viewsets, then retention's.
router = DefaultRouter(trailing_slash=True)
router.register("sweeps", api.SweepViewSet, basename="sweep")
router.register("jobs", api.JobViewSet, basename="job")
router.register("dead-letters", api.DeadLetterViewSet, basename="dead-letter")
router.register("policies", retention_api.PolicyViewSet, basename="policy")
router.register("policy-versions", retention_api.PolicyVersionViewSet, basename="policy-version")
router.register("legal-holds", retention_api.LegalHoldViewSet, basename="legal-hold")
router.register("audit-events", retention_api.AuditEventViewSet, basename="audit-event")
# One's own API tokens: listed (ids, never secrets) and revoked (cleanup_ops.tokens_api).
router.register("tokens", tokens_api.ApiTokenViewSet, basename="api-token")

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("console/", include("cleanup_ops.console_urls")),
    path("api/v1/metrics/", api.MetricsView.as_view(), name="api-metrics"),
    path("api/v1/pause/", api.PauseView.as_view(), name="api-pause"),
    path("api/v1/proof-keys/", api.ProofKeysView.as_view(), name="api-proof-keys"),
    path("api/v1/pause/resume/", api.ResumeView.as_view(), name="api-resume"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/docs/", SwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/redoc/", RedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("api/v1/", include(router.urls)),
    # Last under api/: a path no route above matches is a JSON 404 (retention.apierrors), in any host project.
    re_path(r"^api/(?P<rest>.*)$", api_not_found, name=NOT_FOUND_ROUTE),
    re_path(r"^metrics$", prometheus.prometheus_metrics, name="prometheus-metrics"),
]
