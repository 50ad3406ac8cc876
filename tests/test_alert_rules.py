"""The Prometheus alerting rules in ``docs/deploy/``: promtool's unit tests pass,
and every metric (and label) the rules and their test series use is one a real
``/metrics`` response exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from cleanup_ops.api_tokens import api_token_issue
from cleanup_ops.execution.leases import job_lease
from cleanup_ops.models import CleanupJob, WorkerHeartbeat
from cleanup_ops.recovery.classification import DEAD, Classification, FailureCategory
from cleanup_ops.recovery.failures import job_fail
from properties.models import Property

from .conftest import make_records, utc

DEPLOY = Path(__file__).resolve().parent.parent / "docs" / "deploy"
RULES = DEPLOY / "prometheus-rules.yaml"
RULE_TESTS = DEPLOY / "prometheus-rules.test.yaml"
OLD = utc("2020-01-01T00:00:00Z")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus; .ci/run installs it)"
)
# Labels a scrape adds to every series; everything else must come from /metrics.
SCRAPE_LABELS = {"instance", "job"}
# The only labels /metrics may carry: enumerations and identifiers, never record contents.
ALLOWED_LABELS = {"state", "category", "record_kind", "held", "job_kind", "status", "host", "cluster", "code", "le"}


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, equality matchers) of every ``retention_…`` selector in a PromQL expression."""
    found = []
    for match in re.finditer(r"\b(retention_[a-z0-9_]+)(\{[^}]*\})?", expr):
        matchers = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', match.group(2) or ""))
        found.append((match.group(1), matchers))
    return found


def scrape() -> dict[str, list[dict[str, str]]]:
    """A real /metrics response: sample name -> the label sets of its samples."""
    response = Client().get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    return samples


@pytest.fixture(autouse=True)
def _scrape_from_loopback(settings):  # type: ignore[no-untyped-def]
    # Prometheus on the same host, listed by the operator (no proxy header).
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]


@pytest.fixture
def busy_pipeline(portfolio, active_policy, operator_user):  # type: ignore[no-untyped-def]
    """A running sweep with due jobs, a dead letter, a worker heartbeat, and one
    trigger through the API: every labelled series has a sample."""
    active_policy(portfolio, "lease", 365)
    for i in range(3):
        make_records(Property.objects.create(portfolio=portfolio, name=f"B{i}"), "lease", 2, ended=OLD)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token_issue(user=operator_user).secret}")
    assert api.post("/api/v1/sweeps/", {}, format="json").status_code == 201
    job = CleanupJob.objects.order_by("id").first()
    lease = job_lease(job_id=job.pk, owner="test:1")
    job_fail(lease=lease, classification=Classification(FailureCategory.POLICY_OR_INPUT, DEAD, "InvalidInput"))
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        host="worker-1", cluster="default", pid=4242, started_at=now - timedelta(minutes=5), updated_at=now
    )
    return portfolio


@needs_promtool
def test_the_rules_are_valid_and_pass_their_promtool_unit_tests():
    promtool = str(PROMTOOL)  # found on PATH; only our own files as arguments
    check = subprocess.run([promtool, "check", "rules", RULES.name], cwd=DEPLOY, capture_output=True, text=True)  # noqa: S603
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=DEPLOY, capture_output=True, text=True)  # noqa: S603
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_rule_has_a_severity_a_summary_and_a_runbook_saying_what_to_do():
    for rule in rules():
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert len(rule["annotations"]["runbook"]) > 80, rule["alert"]


def test_every_alert_of_the_rules_has_a_promtool_test_that_fires_it():
    fired = {
        alert["alertname"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for alert in case.get("alert_rule_test", [])
        if alert.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in rules()}


@pytest.mark.django_db
def test_every_metric_and_label_the_rules_use_is_in_a_real_metrics_response(busy_pipeline):
    exported = scrape()
    for rule in rules():
        for name, matchers in selectors(rule["expr"]):
            assert name in exported, f"{rule['alert']}: /metrics has no {name}"
            assert any(matchers.items() <= labels.items() for labels in exported[name]), (
                f"{rule['alert']}: no {name} sample with {matchers}"
            )


@pytest.mark.django_db
def test_the_promtool_input_series_are_shaped_like_the_metrics_output(busy_pipeline):
    exported = scrape()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for series in case["input_series"]:
            [(name, labels)] = selectors(series["series"])
            assert name in exported, f"{case['name']}: /metrics has no {name}"
            own = set(labels) - SCRAPE_LABELS
            assert any(own == set(sample) for sample in exported[name]), (
                f"{case['name']}: {name} is exported with labels {exported[name][0]}, not {sorted(own)}"
            )


@pytest.mark.django_db
def test_metrics_labels_are_enumerations_and_identifiers_never_record_contents(busy_pipeline):
    for name, label_sets in scrape().items():
        for labels in label_sets:
            assert set(labels) <= ALLOWED_LABELS, f"{name}: {labels}"


@pytest.mark.django_db
def test_the_trigger_endpoint_is_timed_in_a_histogram_with_a_bucket_on_its_objective(operator_user, prop):
    def counted(code: str) -> float:
        response = Client().get("/metrics", REMOTE_ADDR="127.0.0.1")
        for family in text_string_to_metric_families(response.content.decode()):
            for sample in family.samples:
                if sample.name == "retention_trigger_request_duration_seconds_count" and sample.labels["code"] == code:
                    return sample.value
        return 0.0

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token_issue(user=operator_user).secret}")
    created, refused = counted("201"), counted("400")
    assert api.post("/api/v1/sweeps/", {}, format="json").status_code == 201
    assert api.post("/api/v1/sweeps/", {"slot": "0001-01-02T00:00Z"}, format="json").status_code == 400
    api.get("/api/v1/sweeps/")  # reads are not the trigger
    assert counted("201") == created + 1
    assert counted("400") == refused + 1
    buckets = {labels["le"] for labels in scrape()["retention_trigger_request_duration_seconds_bucket"]}
    assert "5.0" in buckets


@pytest.mark.django_db
def test_the_alert_series_read_the_pipelines_state(busy_pipeline):
    exported = Client().get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(exported)
        for s in family.samples
    }
    assert values[("retention_dead_letters_created_total", ())] == 1
    assert values[("retention_due_work_jobs", (("job_kind", "delete"),))] == 2
    assert values[("retention_sweep_forecast", (("status", "measuring"),))] == 1
    assert values[("retention_sweep_open_jobs", ())] == 2
    assert values[("retention_cluster_wedged", (("cluster", "default"), ("host", "worker-1")))] == 0
    assert 0 <= values[("retention_cluster_heartbeat_age_seconds", (("cluster", "default"), ("host", "worker-1")))] < 60


@pytest.mark.django_db
def test_a_cluster_that_wrote_no_heartbeat_for_an_hour_is_no_longer_judged(busy_pipeline):
    # A pod scaled away or a retired host leaves its row behind; from the
    # database it would look wedged whenever work waits.
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        host="pod-gone",
        cluster="default",
        pid=7,
        started_at=now - timedelta(hours=3),
        updated_at=now - timedelta(hours=2),
    )
    hosts = {labels["host"] for labels in scrape()["retention_cluster_wedged"]}
    assert hosts == {"worker-1"}
