"""RECOVERY: what happens after a failure, and the operators' decisions.

- ``classification``: one table of rules mapping an exception to a bounded
  category and a disposition (retry or dead), ``Retry-After`` parsing, backoff.
- ``failures``: recording a failed attempt under the lease (fenced): a retry
  with backoff, or a dead letter when the attempt or age budget runs out.
- ``operator``: redrive and dismiss of dead letters (single and bulk, one
  helper), pause and resume — each with a reason and an audit event.
"""
