"""django-q2 brokers (``Q_BROKER``): ORM, Redis, SQS and RabbitMQ.

A message only ever says "job N may be due"; the job table in PostgreSQL
decides (leases, fencing, ledger, dead letters), and the dispatcher re-sends
anything lost. So a broker is chosen for where its polling lands and what it
costs to run, not for delivery guarantees:

* ``orm`` — ``DelayableORM``, django-q2's ORM broker (the default): a hint's
  ``lock`` is its due instant; a fetched message no cluster acknowledged is
  delivered again after ``Q_RETRY``.
* ``redis`` — ``DelayableRedis``, django-q2's Redis broker: hints wait in a
  sorted set until due; a fetched message is gone (``BLPOP``).
* ``sqs`` — ``EndpointSqs``, django-q2's SQS broker: hints use
  ``DelaySeconds`` (at most 900 s; a later instant gets no hint); redelivery
  after ``Q_RETRY``; a dead-letter queue after five receives.
* ``rabbitmq`` — ``RabbitMQ``, ours, on pika: hints wait in a delay queue
  whose TTL dead-letters them into the queue; a dead-letter exchange for
  rejected messages; a fetched message is gone.

**Due-at hints.** django-q2 has no per-message ETA. ``not_before(at)`` around
an ``async_task`` asks the broker to hold the message back until ``at`` (a
retry after backoff or ``Retry-After``, a rate-limit deferral), so an idle
cluster takes the job within a poll of ``at`` instead of at the dispatcher's
next tick. ``max_delay_seconds`` says how far a broker can hold one back; the
dispatcher sends no hint beyond it, and the periodic dispatcher sends the job
when it is due. A hint is never delivered *early*: a worker that found the job
not yet due would drop it, and the job would wait for a re-send.

**Dead letters in the broker.** RabbitMQ's queue has a dead-letter exchange:
a message a cluster rejects (it cannot be read, or its signature is wrong) is
routed to ``<queue>.dead`` for inspection. SQS's queue has a redrive policy to
``<queue>-dead``: a message received five times and never deleted lands there.
These are the broker's own; the job's ``DeadLetter`` row in the database is
what operators act on.

**Acknowledgement.** django-q2 acknowledges a message from its monitor
process, not the process that fetched it. An AMQP delivery can only be
acknowledged on the channel that received it, so the RabbitMQ broker
acknowledges at fetch, after checking the message, like Redis's ``BLPOP``: a
message whose worker is killed is gone, and the dispatcher re-sends the job
once its lease expires. ORM and SQS keep a fetched message locked until
``Q_RETRY`` and deliver it again if it was never acknowledged.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone
from django_q.brokers import Broker
from django_q.brokers.orm import ORM
from django_q.conf import Conf

logger = logging.getLogger(__name__)

_not_before: ContextVar[datetime | None] = ContextVar("cleanup_broker_not_before", default=None)


@contextmanager
def not_before(at: datetime) -> Iterator[None]:
    """Messages enqueued inside stay invisible to clusters until ``at``."""
    token = _not_before.set(at)
    try:
        yield
    finally:
        _not_before.reset(token)


def _delay_seconds() -> float:
    """How far in the future the message being enqueued is due (0: now)."""
    at = _not_before.get()
    if at is None:
        return 0.0
    return max(0.0, (at - timezone.now()).total_seconds())


# --------------------------------------------------------------------------- cluster status

STATUS_WRITE_SECONDS = 2.0  # a cluster's status (django-q2's Stat) is written at most this often
STATUS_TTL_SECONDS = 5  # and lives this long (django-q2 asks for 3 s and writes every guard cycle, 0.5 s)


class ThrottledStatus:
    """django-q2's sentinel saves its cluster's status (``Stat``, read by ``qinfo``,
    ``qmonitor``, ``Stat.get_all``) every guard cycle, 0.5 s. Brokers with no store
    of their own (SQS, RabbitMQ) keep it in the database cache, four statements a
    save: written at most every ``STATUS_WRITE_SECONDS`` per cluster instead, kept
    ``STATUS_TTL_SECONDS``, so an idle cluster's status costs PostgreSQL a fifth."""

    _status_written: dict[str, float]

    def set_stat(self, key: str, value: str, timeout: int) -> Any:
        written = self.__dict__.setdefault("_status_written", {})
        now = time.monotonic()
        if now - written.get(key, -math.inf) < STATUS_WRITE_SECONDS:
            return None
        written[key] = now
        return super().set_stat(key, value, max(timeout, STATUS_TTL_SECONDS))  # type: ignore[misc]  # a mixin: the class after it in the bases has it


# --------------------------------------------------------------------------- ORM


class DelayableORM(ORM):
    """django-q2's ORM broker, able to hold a message back until an instant.

    The ORM broker only hands out messages whose ``lock`` is in the past (its
    claim moves ``lock`` to ``now + retry``), so a message written with ``lock``
    at a future instant stays invisible until then. Messages sent without a
    deadline behave exactly as with the stock ORM broker; ``queue_size`` counts
    messages no cluster has claimed whose instant has come.
    """

    max_delay_seconds: float | None = None  # unlimited

    def enqueue(self, task: str) -> int:
        at = _not_before.get() or timezone.now()
        package = self.get_connection().create(key=self.list_key or Conf.CLUSTER_NAME, payload=task, lock=at)
        return package.pk


# --------------------------------------------------------------------------- Redis

try:  # the client is only needed with Q_BROKER=redis
    from django_q.brokers.redis_broker import Redis as _RedisBroker
except ImportError:  # pragma: no cover - redis not installed
    _RedisBroker = Broker

# Moves up to 100 due messages from the sorted set to the queue's list, atomically.
_PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
for _, message in ipairs(due) do
    redis.call('RPUSH', KEYS[2], message)
    redis.call('ZREM', KEYS[1], message)
end
return #due
"""


class DelayableRedis(_RedisBroker):
    """django-q2's Redis broker (a list per queue, ``BLPOP`` with a 1 s timeout),
    plus a sorted set per queue for due-at hints: scored by the due instant,
    moved to the list by the next fetch after that instant (so within about a
    second of it on an idle cluster). The cluster status goes to Redis too,
    so an idle cluster sends PostgreSQL nothing but its scheduler's check."""

    max_delay_seconds: float | None = None

    @staticmethod
    def get_connection(list_key: str | None = None) -> Any:
        import redis

        # Bounded waits: a dispatcher call (a worker's turn, a web request) must not
        # hang on an unreachable server. The read timeout outlasts BLPOP's 1 s.
        return redis.from_url(Conf.REDIS, socket_connect_timeout=5, socket_timeout=15, health_check_interval=30)

    @property
    def delayed_key(self) -> str:
        return f"{self.list_key}:delayed"

    def enqueue(self, task: str) -> Any:
        delay = _delay_seconds()
        if delay > 0:
            return self.connection.zadd(self.delayed_key, {task: time.time() + delay})
        return self.connection.rpush(self.list_key, task)

    def _promote(self) -> int:
        return int(self.connection.eval(_PROMOTE, 2, self.delayed_key, self.list_key, repr(time.time())))

    def dequeue(self) -> list[tuple[None, bytes]] | None:
        self._promote()
        return super().dequeue()

    def queue_size(self) -> int:
        pipe = self.connection.pipeline(transaction=False)
        pipe.llen(self.list_key)
        pipe.zcount(self.delayed_key, "-inf", repr(time.time()))
        waiting, due = pipe.execute()
        return int(waiting) + int(due)

    def delete_queue(self) -> Any:
        self.connection.delete(self.delayed_key)
        return super().delete_queue()

    def purge_queue(self) -> Any:
        self.connection.delete(self.delayed_key)
        return super().purge_queue()


# --------------------------------------------------------------------------- SQS

try:  # boto3 is only needed with Q_BROKER=sqs
    from botocore.exceptions import ClientError
    from django_q.brokers.aws_sqs import Sqs as _SqsBroker
except ImportError:  # pragma: no cover - boto3 not installed
    _SqsBroker = Broker
    ClientError = Exception

SQS_MAX_DELAY = 900  # DelaySeconds' upper bound
SQS_MAX_RECEIVES = 5  # receives without a delete before SQS moves a message to the DLQ


class EndpointSqs(ThrottledStatus, _SqsBroker):
    """django-q2's SQS broker, pointed at ``Q_SQS_ENDPOINT_URL`` when set (a local
    SQS-compatible server in tests and CI; unset on AWS), with queue names
    prefixed by ``Q_SQS_QUEUE_PREFIX``, a dead-letter queue per queue, due-at
    hints as ``DelaySeconds`` and a queue size read fresh on every call
    (boto3's resource caches the attributes it loaded first)."""

    max_delay_seconds: float | None = SQS_MAX_DELAY

    @staticmethod
    def get_connection(list_key: str | None = None) -> Any:
        from boto3 import Session

        config = dict(Conf.SQS or {})
        region = config.pop("aws_region", None)
        config.pop("receive_message_wait_time_seconds", None)
        if region:
            config["region_name"] = region
        return Session(**config)

    def _own(self) -> None:
        """django-q2 forks its pusher and monitor with the sentinel's broker; boto3's
        sessions and connection pools are not to be shared across processes."""
        if getattr(self, "_pid", None) != os.getpid():
            self.connection = self.get_connection(self.list_key)
            self.queue = self.get_queue()

    def get_queue(self) -> Any:
        from botocore.config import Config

        self._pid = os.getpid()

        # Bounded waits (the read timeout outlasts a 20 s long poll) and few retries:
        # a dispatcher call must not hang on an unreachable endpoint.
        config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"})
        self.sqs = self.connection.resource("sqs", endpoint_url=settings.Q_SQS_ENDPOINT_URL or None, config=config)
        name = f"{settings.Q_SQS_QUEUE_PREFIX}{self.list_key}"
        try:
            return self.sqs.get_queue_by_name(QueueName=name)
        except ClientError as exc:
            if "NonExistentQueue" not in str(exc.response.get("Error", {}).get("Code", "")):
                raise
        dead = self.sqs.create_queue(QueueName=f"{name}-dead", Attributes={"MessageRetentionPeriod": "1209600"})
        redrive = f'{{"deadLetterTargetArn": "{dead.attributes["QueueArn"]}", "maxReceiveCount": "{SQS_MAX_RECEIVES}"}}'
        return self.sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": redrive})

    def enqueue(self, task: str) -> str | None:
        self._own()
        delay = min(SQS_MAX_DELAY, math.ceil(_delay_seconds()))
        params: dict[str, Any] = {"MessageBody": task}
        if delay > 0:
            params["DelaySeconds"] = delay
        return self.queue.send_message(**params).get("MessageId")

    def dequeue(self) -> Any:
        self._own()
        return super().dequeue()

    def acknowledge(self, task_id: str) -> Any:
        self._own()
        return super().acknowledge(task_id)

    def _attribute(self, name: str) -> int:
        self._own()
        self.queue.load()
        return int(self.queue.attributes[name])

    def queue_size(self) -> int:
        return self._attribute("ApproximateNumberOfMessages")

    def lock_size(self) -> int:
        return self._attribute("ApproximateNumberOfMessagesNotVisible")

    def fail(self, task_id: str) -> None:
        # Visible again at once: after SQS_MAX_RECEIVES receives it is in the DLQ.
        self._own()
        self.sqs.Message(self.queue.url, task_id).change_visibility(VisibilityTimeout=0)

    def dead_letter_queue_size(self) -> int:
        dead = self.sqs.get_queue_by_name(QueueName=f"{settings.Q_SQS_QUEUE_PREFIX}{self.list_key}-dead")
        return int(dead.attributes["ApproximateNumberOfMessages"])


# --------------------------------------------------------------------------- RabbitMQ


def amqp_delay_bucket_ms(delay_seconds: float) -> int:
    """The delay queue a hint due in ``delay_seconds`` waits in: the delay rounded
    *up* (a hint must never arrive early) to 1 s up to a minute, 10 s up to ten
    minutes, a minute beyond. At most 60 + 54 + one per further minute queues
    exist at once, each deleted by RabbitMQ a minute after it was last used."""
    if delay_seconds <= 60:
        step = 1
    elif delay_seconds <= 600:
        step = 10
    else:
        step = 60
    return int(math.ceil(delay_seconds / step) * step * 1000)


class RabbitMQ(ThrottledStatus, Broker):
    """A django-q2 broker on RabbitMQ (pika's blocking client, one connection per
    process and queue).

    Topology, declared on connect (idempotent):

    * ``<queue>``: durable, classic; its dead-letter exchange ``<queue>.dead``
      routes every message a cluster rejects to the durable queue
      ``<queue>.dead`` (at most ``Q_AMQP_DEAD_LETTER_MAX`` messages, the oldest
      dropped first) for inspection;
    * ``<queue>.delay.<ms>``: declared when a due-at hint needs it; its
      ``x-message-ttl`` is ``<ms>`` and its dead-letter target is ``<queue>``
      through the default exchange, so a hint moves to the queue when its delay
      is over. All its messages have the same TTL, so none waits behind a longer
      one; it expires a minute after its last use.

    ``dequeue`` takes one message with ``basic.get`` and checks django-q2's
    signature: a message that fails is rejected without requeue (dead-lettered),
    a good one acknowledged at once (django-q2 acknowledges in another process,
    where an AMQP delivery tag means nothing). Publishing uses publisher
    confirms, so an ``async_task`` that returned was taken by RabbitMQ. Messages
    are transient: a hint lost in a RabbitMQ restart is re-sent by the dispatcher.
    """

    max_delay_seconds: float | None = None
    # Set by django-q2's Broker (no stubs): pika's connection, and the server's description once read.
    connection: Any
    _info: str | None

    def __init__(self, list_key: str | None = None) -> None:
        self.channel: Any = None
        self._delay_queues: set[str] = set()
        super().__init__(list_key=list_key)

    def __setstate__(self, state: Any) -> None:
        self.channel = None
        self._delay_queues = set()
        super().__setstate__(state)

    # -- connection and topology

    def get_connection(self, list_key: str | None = None) -> Any:
        import pika

        queue = list_key or self.list_key
        parameters = pika.URLParameters(settings.Q_AMQP_URL)
        if "socket_timeout" not in settings.Q_AMQP_URL:
            parameters.socket_timeout = 5  # bounded waits: a dispatcher call must not hang
        if "blocked_connection_timeout" not in settings.Q_AMQP_URL:
            parameters.blocked_connection_timeout = 30
        connection = pika.BlockingConnection(parameters)
        channel = connection.channel()
        channel.confirm_delivery()
        dead = f"{queue}.dead"
        channel.exchange_declare(exchange=dead, exchange_type="fanout", durable=True)
        channel.queue_declare(
            queue=dead,
            durable=True,
            arguments={"x-max-length": settings.Q_AMQP_DEAD_LETTER_MAX, "x-overflow": "drop-head"},
        )
        channel.queue_bind(queue=dead, exchange=dead)
        channel.queue_declare(queue=queue, durable=True, arguments={"x-dead-letter-exchange": dead})
        self.channel = channel
        self._delay_queues = set()
        self._pid = os.getpid()
        return connection

    def _reconnect(self) -> None:
        try:
            if self.connection is not None and self.connection.is_open:
                self.connection.close()
        except Exception:  # noqa: S110 - the old connection is dead anyway
            pass
        self.connection = self.get_connection(self.list_key)

    def _call(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """``self.<operation>``, reconnecting once if the connection or channel was lost.

        django-q2 forks its pusher and monitor with the sentinel's broker: a child
        never uses (nor closes) the connection it inherited, whose socket the
        parent still uses; it opens its own."""
        import pika.exceptions

        if getattr(self, "_pid", None) != os.getpid():
            self.connection = self.get_connection(self.list_key)
        try:
            return getattr(self, operation)(*args, **kwargs)
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError, OSError):
            logger.warning("RabbitMQ connection lost; reconnecting", extra={"category": "broker_unavailable"})
            self._reconnect()
            return getattr(self, operation)(*args, **kwargs)

    # -- the broker interface

    def enqueue(self, task: str) -> None:
        return self._call("_publish", task, _delay_seconds())

    def _publish(self, task: str, delay: float) -> None:
        import pika

        routing_key = self.list_key
        if delay > 0:
            ttl = amqp_delay_bucket_ms(delay)
            routing_key = f"{self.list_key}.delay.{ttl}"
            if routing_key not in self._delay_queues:
                self.channel.queue_declare(
                    queue=routing_key,
                    durable=True,
                    arguments={
                        "x-message-ttl": ttl,
                        "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": self.list_key,
                        "x-expires": ttl + 60_000,
                    },
                )
                self._delay_queues.add(routing_key)
        self.channel.basic_publish(
            exchange="",
            routing_key=routing_key,
            body=task.encode() if isinstance(task, str) else task,
            properties=pika.BasicProperties(content_type="text/plain", delivery_mode=1),
            mandatory=True,
        )

    def dequeue(self) -> list[tuple[int, str]] | None:
        message = self._call("_get")
        if message is None:
            self.connection.sleep(Conf.POLL)  # keeps the connection's heartbeats going
            return None
        return [message]

    def _get(self) -> tuple[int, str] | None:
        from django_q.signing import BadSignature, SignedPackage

        method, _properties, body = self.channel.basic_get(queue=self.list_key, auto_ack=False)
        if method is None:
            return None
        text = body.decode("utf-8", errors="replace")
        try:
            SignedPackage.loads(text)
        except (TypeError, ValueError, BadSignature):
            logger.warning("RabbitMQ: a message failed its signature check; dead-lettered")
            self.channel.basic_reject(delivery_tag=method.delivery_tag, requeue=False)
            return None
        self.channel.basic_ack(delivery_tag=method.delivery_tag)
        return method.delivery_tag, text

    def acknowledge(self, task_id: Any) -> None:
        return None  # acknowledged when fetched (see the class docstring)

    def fail(self, task_id: Any) -> None:
        return None  # a message that cannot be read is rejected (dead-lettered) when fetched

    def delete(self, task_id: Any) -> None:
        return None

    def queue_size(self) -> int:
        return self._call("_count", self.list_key)

    def _count(self, queue: str) -> int:
        return int(self.channel.queue_declare(queue=queue, passive=True).method.message_count)

    def dead_letter_queue_size(self) -> int:
        return self._call("_count", f"{self.list_key}.dead")

    def lock_size(self) -> int:
        return 0  # nothing is held unacknowledged between fetch and ack

    def purge_queue(self) -> Any:
        return self._call("_purge")

    def _purge(self) -> Any:
        return self.channel.queue_purge(queue=self.list_key)

    def delete_queue(self) -> Any:
        return self._call("_delete_queue")

    def _delete_queue(self) -> Any:
        return self.channel.queue_delete(queue=self.list_key)

    def ping(self) -> bool:
        return bool(self.connection is not None and self.connection.is_open)

    def info(self) -> str:
        if not self._info:
            props = getattr(getattr(self.connection, "_impl", None), "server_properties", {}) or {}
            version = props.get("version", b"")
            version = version.decode() if isinstance(version, bytes) else str(version)
            self._info = f"RabbitMQ {version}".strip()
        return self._info
