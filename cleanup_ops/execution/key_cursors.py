"""The text cursors of non-integer keys (``retention.registry``, "Keys"): the
statements only a batch group with such a kind runs, beside the batch's own
(``execution.statements``) — the integer path's statements stay untouched.

Built like those: each a ``sql.statement``, composed once per shape and cached.
"""

from __future__ import annotations

from psycopg.sql import Composed

from cleanup_ops.sql import Columns, any_of, composed, rows_cte, statement

KEY_CURSOR_COLUMNS: Columns = (("job_id", "bigint"), ("cursor_key", "varchar"))


@statement
def jobs_cursor_keys() -> Composed:
    """The text cursors of jobs the fence has just locked. Parameters: ``ids`` (``any_params``)."""
    return composed("SELECT id, cursor_key FROM {job} WHERE id {ids}", ids=any_of("ids", "bigint"))


@statement
def jobs_cursor_keys_set() -> Composed:
    """Move the text cursors of jobs still under the fence. Parameters: ``g`` (``KEY_CURSOR_COLUMNS``)."""
    return composed(
        "WITH {g} UPDATE {job} SET cursor_key = g.cursor_key FROM g WHERE {job}.id = g.job_id",
        g=rows_cte("g", KEY_CURSOR_COLUMNS),
    )


@statement
def ledger_last_keys() -> Composed:
    """The text last ids of ledger rows being replayed. Parameters: ``ops`` (``any_params``)."""
    return composed(
        "SELECT operation_id, last_key FROM {ledger} WHERE operation_id {ops}",
        ops=any_of("ops", "varchar"),
    )
