from __future__ import annotations

from django.urls import path

from cleanup_ops import views

app_name = "console"

urlpatterns = [
    path("", views.overview_page, name="overview"),
    path("sweeps/", views.sweeps_list, name="sweeps"),
    path("sweeps/<int:sweep_id>/", views.sweep_page, name="sweep"),
    path("sweeps/<int:sweep_id>/proof.<str:fmt>", views.sweep_proof_export, name="sweep_proof"),
    path("jobs/", views.jobs_list, name="jobs"),
    path("jobs/export.csv", views.jobs_export, name="jobs_export"),
    path("jobs/<int:job_id>/", views.job_page, name="job"),
    path("jobs/<int:job_id>/action/", views.job_action, name="job_action"),
    path("jobs/all-matching/", views.jobs_bulk, name="jobs_bulk"),
    path("jobs/selected/", views.jobs_selected, name="jobs_selected"),
    path("dead-letters/", views.dead_letter_inbox, name="dead_letters"),
    path("dead-letters/export.csv", views.dead_letters_export, name="dead_letters_export"),
    path("dead-letters/<int:letter_id>/", views.dead_letter_page, name="dead_letter"),
    path("dead-letters/action/", views.dead_letter_action, name="dead_letter_action"),
    path("dead-letters/all-matching/", views.dead_letters_bulk, name="dead_letters_bulk"),
    path("dead-letters/by-cause/", views.dead_letter_groups, name="dead_letter_groups"),
    path("workers/", views.workers_page, name="workers"),
    path("workers/control/", views.cluster_control, name="cluster_control"),
    path("workers/limits/", views.limit_change, name="limit_change"),
    path("pauses/", views.pauses_page, name="pauses"),
    # The customer model's key, of its own type (an integer, a UUID…): read by the view.
    path("portfolios/<str:portfolio_id>/", views.portfolio_page, name="portfolio"),
    path("audit/", views.audit_log, name="audit"),
    path("search/", views.search_page, name="search"),
    path("pause/", views.pause_toggle, name="pause"),
]
