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
    result = start({"DATABASE_URL": f"sqlite:///{tmp_path}/x.sqlite3", "DEBUG": "false"})
    assert result.returncode == 0, result.stderr
    assert "started" in result.stdout
