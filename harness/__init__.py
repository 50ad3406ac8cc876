"""Shared harness for the benchmarks (bench/), the chaos run (chaos/) and scripts/.

One implementation of the throwaway PostgreSQL cluster (``harness.postgres``,
also behind ``scripts/pg-cluster.sh``), of ``manage.py qcluster`` supervision
(``harness.qcluster``), of the CPU watch that tells a measurement whether the
shared machine was busy (``harness.cpu``) and of small process and port
helpers (``harness.procs``, ``harness.ports``).

Only the standard library is needed to start and stop a cluster, so
``scripts/pg-cluster.sh`` can run it with any Python 3.11+; the database helpers
import psycopg when called.
"""
