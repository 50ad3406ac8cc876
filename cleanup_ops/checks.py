"""System checks of the console's product settings (run at start-up by
``runserver``, ``migrate``, ``qcluster`` and ``manage.py check``).

``CONSOLE_REFRESH_SECONDS``: how often a live page re-fetches its figures.
Its default lives here, in the app (``DEFAULT_REFRESH_SECONDS``), so a host
project that never names it gets 5 s; ``config/settings.py`` reads it from
the environment when set. A value that is not a whole number from
``MIN_REFRESH_SECONDS`` to ``MAX_REFRESH_SECONDS`` is an error naming the
setting: a page refreshed every 0 s would hammer the database, one every
hour is not live.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

DEFAULT_REFRESH_SECONDS = 5
MIN_REFRESH_SECONDS = 1
MAX_REFRESH_SECONDS = 600


def refresh_problem(value: Any) -> str | None:
    """Why ``value`` is no refresh interval, or None."""
    if isinstance(value, bool):
        return f"must be a whole number of seconds, got {value!r}"
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()):
            return f"must be a whole number of seconds, got {value!r}"
        value = int(text)
    if not isinstance(value, int):
        return f"must be a whole number of seconds, got {value!r}"
    if not MIN_REFRESH_SECONDS <= value <= MAX_REFRESH_SECONDS:
        return f"must be from {MIN_REFRESH_SECONDS} to {MAX_REFRESH_SECONDS} seconds, got {value}"
    return None


def refresh_seconds() -> int:
    """The interval in force: the setting when valid, else the default (the
    system check has reported the bad value)."""
    value = getattr(settings, "CONSOLE_REFRESH_SECONDS", DEFAULT_REFRESH_SECONDS)
    if refresh_problem(value) is not None:
        return DEFAULT_REFRESH_SECONDS
    return int(str(value).strip())


@checks.register()
def check_console_refresh(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    value = getattr(settings, "CONSOLE_REFRESH_SECONDS", DEFAULT_REFRESH_SECONDS)
    problem = refresh_problem(value)
    if problem is None:
        return []
    return [
        checks.Error(
            f"CONSOLE_REFRESH_SECONDS {problem}.",
            hint=f"Set CONSOLE_REFRESH_SECONDS to a whole number from {MIN_REFRESH_SECONDS} to "
            f"{MAX_REFRESH_SECONDS} (default {DEFAULT_REFRESH_SECONDS}), or leave it unset.",
            id="cleanup_ops.E101",
        )
    ]
