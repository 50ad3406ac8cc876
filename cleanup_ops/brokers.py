"""django-q2's ORM broker, able to hold a message back until an instant.

django-q2 has no per-message ETA. The ORM broker, though, only hands out
messages whose ``lock`` is in the past (its claim moves ``lock`` to
``now + retry``), so a message written with ``lock`` at a future instant stays
invisible until then. ``send_at`` uses exactly that for "job N becomes due at
T" hints — a retry after backoff or ``Retry-After``, a rate-limit deferral —
so an idle cluster picks the job up within one poll of T instead of at the
dispatcher's next tick. The job table stays the truth: a lost or early hint
changes nothing, and the periodic dispatcher re-sends what is due.

Configured with ``Q_CLUSTER["broker_class"]``; messages sent without a
deadline behave exactly as with the stock ORM broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf

_not_before: ContextVar[datetime | None] = ContextVar("cleanup_broker_not_before", default=None)


class DelayableORM(ORM):
    def enqueue(self, task: str) -> int:
        at = _not_before.get() or timezone.now()
        package = self.get_connection().create(key=self.list_key or Conf.CLUSTER_NAME, payload=task, lock=at)
        return package.pk


@contextmanager
def not_before(at: datetime) -> Iterator[None]:
    """Messages enqueued inside stay invisible to clusters until ``at``."""
    token = _not_before.set(at)
    try:
        yield
    finally:
        _not_before.reset(token)
