"""EXECUTION: leased, fenced, bounded work on a job.

- ``leases``: claim a due job (caps, pauses), the fence every write checks,
  release, rate-limit tokens.
- ``batches``: the batch transaction of a delete job (scope locks, policy,
  replay, DELETE with the hold check, ledger, outbox).
- ``runner``: a slice (one lease, a bounded number of batches), a worker's
  turn (slices of several due jobs within one budget), the in-process drain.

The purge job's slice (HTTP outside any transaction) is in
``cleanup_ops.downstream.purge``; it leases, fences and releases through
``leases`` like a delete job.
"""
