"""Throwaway broker servers on free loopback ports: redis-server, rabbitmq-server and
moto's SQS-compatible server, for the broker tests, ``make test``, the bench and CI.

Each server runs in a fresh /tmp directory in its own session (process group) and is
stopped with its whole group; nothing is written outside that directory. A server
whose program is not installed is reported as unavailable with the reason (the
Debian packages ``redis-server`` and ``rabbitmq-server``; moto comes with
``requirements-dev.txt``).

``env`` gives the variables ``config/settings.py`` reads for the broker
(``Q_REDIS_URL``; ``Q_AMQP_URL``; ``Q_SQS_ENDPOINT_URL``, ``Q_SQS_REGION`` and dummy
AWS credentials) — without ``Q_BROKER``, so exporting them changes nothing until a
process is started with ``Q_BROKER=<kind>``.

From a shell::

    python -m harness.brokers serve --env-file F redis rabbitmq sqs   # until SIGTERM; F: export lines
    python -m harness.brokers run redis -- .venv/bin/python chaos/run.py --ci   # Q_BROKER=redis for CMD
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.ports import free_port

KINDS = ("redis", "rabbitmq", "sqs")
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
START_TIMEOUT = {"redis": 15.0, "rabbitmq": 90.0, "sqs": 30.0}


class BrokerError(RuntimeError):
    """The server could not be started (its log is in the message)."""


def unavailable_reason(kind: str) -> str | None:
    """Why a ``kind`` server cannot be started here, or None if it can."""
    if kind == "redis":
        return None if shutil.which("redis-server") else "redis-server is not installed (apt-get install redis-server)"
    if kind == "rabbitmq":
        if not Path(RABBITMQ_SERVER).exists():
            return "rabbitmq-server is not installed (apt-get install rabbitmq-server)"
        return None
    if kind == "sqs":
        try:
            import moto.server  # noqa: F401
        except ImportError:
            return "moto's server mode is not installed (pip install -r requirements-dev.txt)"
        return None
    raise ValueError(f"unknown broker server {kind!r}; expected one of {', '.join(KINDS)}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class BrokerServer:
    """One server. ``start()`` returns its ``env``; use ``with`` or call ``stop()`` in ``finally``."""

    def __init__(self, kind: str) -> None:
        reason = unavailable_reason(kind)
        if reason:
            raise BrokerError(reason)
        self.kind = kind
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.env: dict[str, str] = {}
        self._epmd_port = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> dict[str, str]:
        if self.proc is not None:
            return self.env
        self.dir = Path(tempfile.mkdtemp(prefix=f"broker-{self.kind}."))
        self.port = free_port()
        try:
            getattr(self, f"_start_{self.kind}")()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.env

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        assert self.dir is not None
        log = (self.dir / "server.log").open("wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=self.dir,
            env=env or dict(os.environ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def _start_redis(self) -> None:
        self._spawn(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--daemonize",
                "no",
            ]
        )
        self.env = {"Q_REDIS_URL": f"redis://127.0.0.1:{self.port}/0"}

    def _start_rabbitmq(self) -> None:
        assert self.dir is not None
        self._epmd_port = free_port()
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        (self.dir / "rabbitmq-env.conf").write_text("")
        env = {
            **os.environ,
            "HOME": str(self.dir),  # the Erlang cookie lives here
            "RABBITMQ_NODENAME": f"harness{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "ERL_EPMD_PORT": str(self._epmd_port),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
            "RABBITMQ_LOGS": "-",
        }
        self._spawn([RABBITMQ_SERVER], env)
        self.env = {"Q_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"}

    def _start_sqs(self) -> None:
        self._spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)])
        self.env = {
            "Q_SQS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
            "Q_SQS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "harness",
            "AWS_SECRET_ACCESS_KEY": "harness",
        }

    def _ready(self) -> bool:
        if not _port_open(self.port):
            return False
        if self.kind == "rabbitmq":
            try:
                import pika

                pika.BlockingConnection(pika.URLParameters(self.env["Q_AMQP_URL"])).close()
            except Exception:
                return False
        return True

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT[self.kind]
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BrokerError(f"{self.kind} server exited ({self.proc.returncode}):\n{self.log_text()}")
            if self._ready():
                return
            time.sleep(0.2)
        raise BrokerError(f"{self.kind} server not ready after {START_TIMEOUT[self.kind]:g} s:\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return (self.dir / "server.log").read_text(errors="replace")[-4000:]  # type: ignore[operator]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the server's process group (TERM, then KILL) and remove its directory. Idempotent."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            self.proc = None
        if self._epmd_port:
            # RabbitMQ started an epmd of its own on this port (a daemon outside our group).
            epmd = shutil.which("epmd") or next(iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None)
            if epmd:
                subprocess.run(
                    [str(epmd), "-kill"],
                    env={**os.environ, "ERL_EPMD_PORT": str(self._epmd_port)},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    check=False,
                    timeout=10,
                )
            self._epmd_port = 0
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> BrokerServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def broker_env(kind: str, server_env: dict[str, str]) -> dict[str, str]:
    """The variables a process needs to run on broker ``kind`` (``Q_BROKER`` included)."""
    return {"Q_BROKER": kind, **server_env}


def reset(kind: str, env: dict[str, str]) -> None:
    """Empty the broker: every queue and message, so a test starts from nothing."""
    if kind == "redis":
        import redis

        redis.from_url(env["Q_REDIS_URL"]).flushdb()
    elif kind == "rabbitmq":
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(env["Q_AMQP_URL"]))
        try:
            for queue in _rabbitmq_queues(env):
                channel = connection.channel()
                channel.queue_delete(queue=queue)
        finally:
            connection.close()
    elif kind == "sqs":
        import boto3

        client = boto3.client(
            "sqs",
            endpoint_url=env["Q_SQS_ENDPOINT_URL"],
            region_name=env["Q_SQS_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        for url in client.list_queues().get("QueueUrls", []):
            client.delete_queue(QueueUrl=url)


def _rabbitmq_queues(env: dict[str, str]) -> list[str]:
    """The queues this application declares (the management API is not enabled here)."""
    names = []
    for queue in ("retention", os.environ.get("Q_PURGE_CLUSTER") or "retention-purge"):
        names += [queue, f"{queue}.dead"]
    return names


# ---------------------------------------------------------------------- command line


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.brokers", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the installed servers of KIND..., write their env, run until SIGTERM")
    serve.add_argument("--env-file", type=Path, required=True, help="written once every server is ready")
    serve.add_argument("kinds", nargs="+", choices=KINDS)
    run = sub.add_parser("run", help="start a KIND server, run CMD with Q_BROKER=KIND and its env, stop the server")
    run.add_argument("kind", choices=KINDS)
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    servers: list[BrokerServer] = []
    try:
        if args.command == "run":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                parser.error("run: no command given")
            server = BrokerServer(args.kind)
            servers.append(server)
            env = {**os.environ, **broker_env(args.kind, server.start())}
            print(f"harness.brokers: {args.kind} server on 127.0.0.1:{server.port}", file=sys.stderr, flush=True)
            return subprocess.run(cmd, env=env, check=False).returncode
        lines = []
        for kind in args.kinds:
            reason = unavailable_reason(kind)
            if reason:
                print(f"harness.brokers: no {kind} server: {reason}", file=sys.stderr, flush=True)
                continue
            server = BrokerServer(kind)
            servers.append(server)
            try:
                started = server.start()
            except BrokerError as exc:  # the others still start; this broker's tests skip with the reason
                print(f"harness.brokers: no {kind} server: {exc}", file=sys.stderr, flush=True)
                continue
            for key, value in started.items():
                lines.append(f"export {key}={shlex.quote(value)}")
            print(f"harness.brokers: {kind} server on 127.0.0.1:{server.port}", file=sys.stderr, flush=True)
        tmp = args.env_file.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(args.env_file)
        while True:
            time.sleep(3600)
    except BrokerError as exc:
        print(f"harness.brokers: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
