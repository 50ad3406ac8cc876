"""``make demo-incident``: the demo ends with something to act on."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from cleanup_ops.models import DeadLetter, PipelinePause, Sweep
from demo.services import INCIDENT_PAUSE_REASON

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = ["--portfolios", "3", "--properties-per-portfolio", "2", "--records-per-property", "30", "--seed", "3"]


def test_the_incident_demo_leaves_a_running_sweep_a_paused_portfolio_and_letters_from_the_store(docstore):
    call_command("seed_demo", *ARGS, stdout=StringIO())
    call_command("seed_attachments", "--fraction", "0.5", "--seed", "3", stdout=StringIO())
    out = StringIO()
    call_command("demo_incident", "--max-seconds", "0", stdout=out)
    pause = PipelinePause.objects.active().get()
    assert pause.portfolio_id is not None and pause.reason == INCIDENT_PAUSE_REASON
    sweep = Sweep.objects.get()
    assert sweep.status == Sweep.Status.RUNNING
    assert sweep.jobs.open().exists() and not sweep.jobs.open().exclude(portfolio_id=pause.portfolio_id).exists()
    letters = DeadLetter.objects.open()
    assert letters.exists() and set(letters.values_list("category", flat=True)) == {"downstream_rejected"}
    assert set(letters.values_list("job__job_kind", flat=True)) == {"purge"}
    printed = out.getvalue()
    assert "Incident staged" in printed and "/console/dead-letters/" in printed and "password" in printed
