"""The database's clock, as every lease, expiry, backoff, budget and cap decision reads it.

Why not ``timezone.now()``: workers run on many hosts, and a host whose clock
runs 120 s ahead would see another worker's live lease as expired (and take
a second lease of a portfolio capped at one), defer by the wrong amount, or
spend a budget early. Every such decision compares with timestamps the
database stores, so the time it uses must be the database's.

How, without a statement per decision: each process measures the offset of
the database clock from this host's clock (``SELECT clock_timestamp()``
between two readings of the host clock; the error is at most half a round
trip) on first use and again every ``CLEANUP_CLOCK_SYNC_SECONDS`` (measured on
the monotonic clock, which no clock step moves), and ``now()`` is the host's
time plus that offset. A host clock that *steps* between two syncs is wrong
by the step for at most one sync interval; a clock that is merely off by any
amount is corrected.

The host clock is read twice on purpose: the offset is measured against the
operating system's real clock (``clock_gettime`` through libc, which test
time travel does not move), while ``now()`` adds it to
``django.utils.timezone.now()``, which time-machine moves in tests. So a test
travels the pipeline's time exactly as before, and a process whose *real*
clock is skewed (``faketime`` in ``tests/test_clock_skew.py``) still decides on
the database's time.
"""

from __future__ import annotations

import ctypes
import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_CLOCK_REALTIME = 0
_libc_clock_gettime = None
try:
    # The process's global symbol namespace (dlopen(NULL)), not libc's own
    # handle: the clock_gettime every C caller of this process gets, so an
    # interposed clock (libfaketime, as tests skew a worker) is the one read.
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc_clock_gettime = _libc.clock_gettime
    _libc_clock_gettime.argtypes = [ctypes.c_int, ctypes.POINTER(_Timespec)]
except (OSError, AttributeError):  # pragma: no cover - no libc clock_gettime (not Linux or macOS)
    _libc_clock_gettime = None


def host_clock() -> float:
    """This host's real wall clock (seconds since the epoch), from the operating system."""
    if _libc_clock_gettime is not None:
        spec = _Timespec()
        if _libc_clock_gettime(_CLOCK_REALTIME, ctypes.byref(spec)) == 0:
            return spec.tv_sec + spec.tv_nsec / 1e9
    return time.time()  # pragma: no cover


_lock = threading.Lock()
_offset: dict[str, tuple[float, float]] = {}  # database host+name -> (offset seconds, monotonic at sync)


def _key() -> str:
    return f"{connection.settings_dict.get('HOST')}:{connection.settings_dict.get('NAME')}"


def measure_offset() -> float:
    """Seconds the database clock is ahead of this host's real clock."""
    with connection.cursor() as cur:
        before = host_clock()
        cur.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
        after = host_clock()
        (database,) = cur.fetchone()
    offset = float(database) - (before + after) / 2
    # Within the measurement's own uncertainty (half the round trip, and
    # the database clock's microseconds) the two clocks agree: call it 0, so
    # a process on a well-synchronised host decides exactly on its own
    # readings (and a test's frozen time stays exact).
    uncertainty = (after - before) / 2 + 0.001
    return 0.0 if abs(offset) <= uncertainty else offset


def offset() -> float:
    """The current offset, measured again when older than ``CLEANUP_CLOCK_SYNC_SECONDS``."""
    key = _key()
    known = _offset.get(key)
    mono = time.monotonic()
    if known is not None and mono - known[1] < settings.CLEANUP_CLOCK_SYNC_SECONDS:
        return known[0]
    if connection.needs_rollback:
        # Inside a transaction that already failed no statement runs: keep
        # the last measurement (or none) until the next sync.
        return known[0] if known else 0.0
    value = measure_offset()
    with _lock:
        _offset[key] = (value, mono)
    return value


def now() -> datetime:
    """The database's time, as an aware datetime."""
    return timezone.now() + timedelta(seconds=offset())


def now_ts() -> float:
    """``now()`` as seconds since the epoch (the rate limiter's unit)."""
    return now().timestamp()
