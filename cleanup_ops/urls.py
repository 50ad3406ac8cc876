from __future__ import annotations

from django.urls import path

from cleanup_ops import views

app_name = "console"

urlpatterns = [
    path("", views.overview_page, name="overview"),
    path("sweeps/<int:sweep_id>/", views.sweep_page, name="sweep"),
    path("sweeps/<int:sweep_id>/proof.<str:fmt>", views.sweep_proof_export, name="sweep_proof"),
    path("dead-letters/", views.dead_letter_inbox, name="dead_letters"),
    path("dead-letters/action/", views.dead_letter_action, name="dead_letter_action"),
    path("audit/", views.audit_log, name="audit"),
    path("pause/", views.pause_toggle, name="pause"),
]
