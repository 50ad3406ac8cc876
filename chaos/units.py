"""The shipped supervision, read from the systemd units in ``docs/deploy/``.

The chaos run supervises its cluster the way those units do, with the values
they ship: the liveness command and its interval (``retention-liveness@``, ``OnUnitInactiveSec``),
the stop procedure (``KillMode=mixed``: SIGTERM to the main process, SIGKILL
to the rest after ``TimeoutStopSec``) and ``Restart=always`` with its
``RestartSec`` (``retention-qcluster@``). An instance's own environment
comes from ``qcluster-<instance>.env.example`` (the purge cluster's queue).
Change a unit and the chaos run follows it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent.parent / "docs" / "deploy"


def unit_read(path: Path) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values…]}}`` of a systemd unit file (continuation lines joined)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        if current is None or "=" not in line:
            raise ValueError(f"{path.name}: cannot read {raw!r}")
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    """A systemd time span as used in these units: ``15``, ``15s``, ``2min``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m)?", value)
    if not match:
        raise ValueError(f"unsupported time span {value!r}")
    number = float(match.group(1))
    return number * 60 if match.group(2) in {"min", "m"} else number


def env_file_read(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of an environment file (empty when there is none)."""
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and line[0] != "#")
    return {key.strip(): value.strip() for key, value in pairs}


def _one(unit: dict[str, dict[str, list[str]]], section: str, key: str, name: str) -> str:
    values = unit.get(section, {}).get(key)
    if not values:
        raise ValueError(f"{name}: [{section}] {key}= is missing")
    return values[-1]


@dataclass(frozen=True)
class Supervision:
    instance: str
    liveness_argv: list[str]  # manage.py and its arguments, as ExecStart runs them
    liveness_interval: float  # OnUnitInactiveSec of the timer: from the end of the previous check
    stop_grace: float  # TimeoutStopSec of the qcluster unit
    restart_delay: float  # RestartSec of the qcluster unit
    environment: dict[str, str]  # the instance's env file (example) and Environment=, instance substituted


def supervision(instance: str) -> Supervision:
    """The shipped supervision of ``retention-qcluster@<instance>``, checked for the
    properties the chaos run relies on (and the issue asks for)."""
    qcluster = unit_read(DEPLOY / "retention-qcluster@.service")
    service = unit_read(DEPLOY / "retention-liveness@.service")
    timer = unit_read(DEPLOY / "retention-liveness@.timer")
    name = "retention-qcluster@.service"
    if _one(qcluster, "Service", "KillMode", name) != "mixed":
        raise ValueError(f"{name}: KillMode must be mixed (SIGTERM to the main process, then SIGKILL to the rest)")
    if _one(qcluster, "Service", "Restart", name) != "always":
        raise ValueError(f"{name}: Restart must be always")
    argv = shlex.split(_one(service, "Service", "ExecStart", "retention-liveness@.service"))
    if argv[1:4] != ["manage.py", "cleanup_health", "--liveness"]:
        raise ValueError(f"retention-liveness@.service: ExecStart is not cleanup_health --liveness: {argv}")
    environment = env_file_read(DEPLOY / f"qcluster-{instance}.env.example")
    for assignment in qcluster["Service"].get("Environment", []):
        key, value = assignment.split("=", 1)
        environment[key] = value.replace("%i", instance)
    return Supervision(
        instance=instance,
        liveness_argv=argv[1:],
        liveness_interval=seconds(_one(timer, "Timer", "OnUnitInactiveSec", "retention-liveness@.timer")),
        stop_grace=seconds(_one(qcluster, "Service", "TimeoutStopSec", name)),
        restart_delay=seconds(_one(qcluster, "Service", "RestartSec", name)),
        environment=environment,
    )
