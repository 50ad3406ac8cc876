"""Start-up validation: a malformed environment fails naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def start(env_overrides: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SECRET_KEY", "DEBUG"}}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "SECRET_KEY": "x" * 50, **env_overrides})
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); print('started')"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "not-a-url"),
        ("DATABASE_URL", "mysql://u@h/db"),
        ("DATABASE_URL", "postgres://u@h:5432/"),
        ("DEBUG", "maybe"),
        ("CONN_MAX_AGE", "forever"),
        ("CLEANUP_BATCH_SIZE", "5000"),
        ("CLEANUP_SCHEDULE", "every night"),
        ("Q_RETRY", "10"),
        ("METRICS_ALLOWED_IPS", "127.0.0.1,localhost"),
        ("API_BROWSABLE", "sometimes"),
        ("LOGIN_COOLOFF_MINUTES", "0"),
        ("CLEANUP_TABLE_PARTITION_PAUSE_RATIO", "-1"),
        ("CLEANUP_TABLE_PARTITION_PAUSE_RATIO", "slow"),
        ("CLEANUP_TABLE_PARTITION_PAUSE_SECONDS", "-0.5"),
    ],
)
def test_a_malformed_variable_stops_start_up_naming_it(name, value):
    result = start({name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert f"{name}:" in result.stderr


def test_secret_key_is_required_when_debug_is_off():
    result = start({"SECRET_KEY": "", "DEBUG": "false"})
    assert result.returncode != 0
    assert "SECRET_KEY: required when DEBUG is off" in result.stderr


def test_a_valid_environment_starts(tmp_path):
    result = start({"DATABASE_URL": "postgres://app@127.0.0.1:5432/app", "DEBUG": "false"})
    assert result.returncode == 0, result.stderr
    assert "started" in result.stdout


# --- Q_BROKER: the django-q2 broker and its options --------------------------------


NO_BROKER_SERVERS = {"Q_REDIS_URL": "", "Q_AMQP_URL": "", "Q_SQS_REGION": "", "Q_SQS_ENDPOINT_URL": ""}


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("Q_BROKER", {"Q_BROKER": "kafka"}),
        ("Q_REDIS_URL", {"Q_BROKER": "redis"}),
        ("Q_REDIS_URL", {"Q_BROKER": "redis", "Q_REDIS_URL": "http://127.0.0.1:6379/0"}),
        ("Q_REDIS_URL", {"Q_BROKER": "redis", "Q_REDIS_URL": "redis://127.0.0.1:port/0"}),
        ("Q_REDIS_URL", {"Q_BROKER": "redis", "Q_REDIS_URL": "redis:///0"}),
        ("Q_SQS_REGION", {"Q_BROKER": "sqs"}),
        ("Q_SQS_REGION", {"Q_BROKER": "sqs", "Q_SQS_REGION": "the moon"}),
        ("Q_SQS_WAIT_SECONDS", {"Q_BROKER": "sqs", "Q_SQS_REGION": "eu-west-1", "Q_SQS_WAIT_SECONDS": "30"}),
        ("Q_SQS_ENDPOINT_URL", {"Q_SQS_ENDPOINT_URL": "ftp://127.0.0.1:9324"}),
        ("Q_SQS_QUEUE_PREFIX", {"Q_SQS_QUEUE_PREFIX": "a prefix with spaces"}),
        ("Q_AMQP_URL", {"Q_BROKER": "rabbitmq"}),
        ("Q_AMQP_URL", {"Q_BROKER": "rabbitmq", "Q_AMQP_URL": "redis://127.0.0.1:5672/"}),
        ("Q_PURGE_CLUSTER", {"Q_PURGE_CLUSTER": "Purge Queue"}),
        ("Q_PURGE_WORKERS", {"Q_PURGE_WORKERS": "0"}),
        ("Q_CLUSTER_NAME", {"Q_CLUSTER_NAME": "elsewhere"}),
    ],
)
def test_a_bad_broker_setting_stops_start_up_naming_it(name, overrides):
    # `make test` exports the throwaway servers' variables; a missing one must be missing here.
    result = start({**NO_BROKER_SERVERS, **overrides})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert f"{name}:" in result.stderr


def test_a_broker_url_with_a_password_is_never_echoed_in_the_error():
    result = start({"Q_BROKER": "redis", "Q_REDIS_URL": "http://user:s3cret-pass@127.0.0.1:6379/0"})
    assert result.returncode != 0
    assert "Q_REDIS_URL:" in result.stderr
    assert "s3cret-pass" not in result.stderr


@pytest.mark.parametrize(
    ("overrides", "broker_class", "option"),
    [
        ({}, "cleanup_ops.brokers.DelayableORM", "orm"),
        (
            {"Q_BROKER": "redis", "Q_REDIS_URL": "redis://127.0.0.1:6379/2"},
            "cleanup_ops.brokers.DelayableRedis",
            "redis",
        ),
        ({"Q_BROKER": "sqs", "Q_SQS_REGION": "eu-west-1"}, "cleanup_ops.brokers.EndpointSqs", "sqs"),
        ({"Q_BROKER": "rabbitmq", "Q_AMQP_URL": "amqp://u:p@127.0.0.1:5672/%2F"}, "cleanup_ops.brokers.RabbitMQ", None),
    ],
)
def run_settings(code: str, overrides: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``code`` after ``django.setup()`` with the environment less any broker choice, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SECRET_KEY", "DEBUG", "Q_BROKER"}}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "SECRET_KEY": "x" * 50, **overrides})
    return subprocess.run(  # noqa: S603 - our own interpreter and code
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("overrides", "broker_class", "option"),
    [
        ({}, "cleanup_ops.brokers.DelayableORM", "orm"),
        (
            {"Q_BROKER": "redis", "Q_REDIS_URL": "redis://127.0.0.1:6379/2"},
            "cleanup_ops.brokers.DelayableRedis",
            "redis",
        ),
        ({"Q_BROKER": "sqs", "Q_SQS_REGION": "eu-west-1"}, "cleanup_ops.brokers.EndpointSqs", "sqs"),
        ({"Q_BROKER": "rabbitmq", "Q_AMQP_URL": "amqp://u:p@127.0.0.1:5672/%2F"}, "cleanup_ops.brokers.RabbitMQ", None),
    ],
)
def test_each_broker_configures_django_q2(overrides, broker_class, option):
    """Settings only: nothing connects at start-up, so no server is needed here."""
    result = run_settings(
        "from django.conf import settings; from django_q.conf import Conf;"
        " print(Conf.BROKER_CLASS, sorted(settings.Q_CLUSTER), sorted(settings.Q_CLUSTER['ALT_CLUSTERS']))",
        overrides,
    )
    assert result.returncode == 0, result.stderr
    assert broker_class in result.stdout
    options = result.stdout.split("] [")[0]
    for name in ("orm", "redis", "sqs"):
        assert (f"'{name}'" in options) == (name == option)
    assert "['retention-purge']" in result.stdout  # purges have their own queue by default


def test_the_purge_cluster_is_selected_with_q_cluster_name():
    result = run_settings(
        "from django_q.conf import Conf; print(Conf.CLUSTER_NAME, Conf.WORKERS, Conf.QUEUE_LIMIT)",
        {"Q_CLUSTER_NAME": "retention-purge", "Q_PURGE_WORKERS": "3", "Q_WORKERS": "2"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["retention-purge", "3", "3"]


@pytest.mark.parametrize(
    ("debug", "browsable", "expected"), [("false", None, False), ("true", None, True), ("false", "true", True)]
)
def test_the_browsable_api_is_off_outside_debug_unless_asked_for(debug, browsable, expected):
    overrides = {"DEBUG": debug, **({"API_BROWSABLE": browsable} if browsable else {})}
    env = {k: v for k, v in os.environ.items() if k != "API_BROWSABLE"}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "SECRET_KEY": "x" * 50, **overrides})
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
         "print(settings.REST_FRAMEWORK['DEFAULT_RENDERER_CLASSES'])"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert ("BrowsableAPIRenderer" in result.stdout) is expected


def cluster_name(env: dict[str, str]) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.CLEANUP_CLUSTER_NAME)",
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in {"CLEANUP_CLUSTER_NAME", "Q_CLUSTER_NAME"}}
        | {"DJANGO_SETTINGS_MODULE": "config.settings", "SECRET_KEY": "x" * 50, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_delete_and_a_purge_cluster_started_without_names_get_distinct_names():
    """Issue 30, item 3: the same default for both made them overwrite one heartbeat row."""
    delete = cluster_name({})
    purge = cluster_name({"Q_CLUSTER_NAME": "retention-purge"})
    assert (delete, purge) == ("default", "purge")
    assert cluster_name({"Q_CLUSTER_NAME": "retention-purge", "CLEANUP_CLUSTER_NAME": "p2"}) == "p2"
