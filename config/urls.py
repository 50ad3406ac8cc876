from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from cleanup_ops import api, prometheus
from config.docs import RedocView, SwaggerView
from retention import api as retention_api

# One router for /api/v1/ (one API root): the pipeline's viewsets, then retention's.
router = DefaultRouter(trailing_slash=True)
router.register("sweeps", api.SweepViewSet, basename="sweep")
router.register("jobs", api.JobViewSet, basename="job")
router.register("dead-letters", api.DeadLetterViewSet, basename="dead-letter")
router.register("policies", retention_api.PolicyViewSet, basename="policy")
router.register("policy-versions", retention_api.PolicyVersionViewSet, basename="policy-version")
router.register("legal-holds", retention_api.LegalHoldViewSet, basename="legal-hold")
router.register("audit-events", retention_api.AuditEventViewSet, basename="audit-event")

urlpatterns = [
    path("", RedirectView.as_view(url="/console/", permanent=False)),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("console/", include("cleanup_ops.urls")),
    path("api/v1/metrics/", api.MetricsView.as_view(), name="api-metrics"),
    path("api/v1/pause/", api.PauseView.as_view(), name="api-pause"),
    path("api/v1/pause/resume/", api.ResumeView.as_view(), name="api-resume"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/docs/", SwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/redoc/", RedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("api/v1/", include(router.urls)),
    re_path(r"^metrics$", prometheus.prometheus_metrics, name="prometheus-metrics"),
]
