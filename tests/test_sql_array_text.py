"""Array parameters go as the array's text: PostgreSQL reads back every value
psycopg's own list would have given it, on both kinds of cursor the batch uses."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from django.db import connection
from psycopg import sql as pg

from cleanup_ops import sql
from cleanup_ops.execution.batches import batch_cursor
from cleanup_ops.models import JobState


class Size(enum.IntEnum):
    SMALL = 3


AWKWARD = ["", " ", "NULL", "null", 'a"b', "a\\b", '\\"', "{x,y}", "a,b", "tab\there", "née", '"', "x" * 300]
COLUMNS: list[tuple[str, list[object]]] = [
    ("bigint", [1, 0, -5, 2**62, None]),
    ("integer", [Size.SMALL, 7]),
    ("text", [*AWKWARD, None]),
    ("varchar", [JobState.DONE, JobState.LEASED, "plain"]),
    ("boolean", [True, False, None]),
    ("uuid", [uuid.UUID(int=0), uuid.uuid4(), None]),
    (
        "timestamptz",
        [
            datetime(2026, 12, 7, 19, 0, tzinfo=UTC),
            datetime(2026, 12, 7, 19, 0, 0, 123456, tzinfo=UTC),
            datetime(1999, 1, 1, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
            None,
        ],
    ),
    ("bigint", []),
]


def _read_back(cur: object, sql_type: str, value: object) -> list[object]:
    statement = pg.SQL("SELECT CAST({param} AS {type}[])").format(param=pg.Placeholder("a"), type=pg.SQL(sql_type))
    return sql.execute(statement, {"a": value}, cur=cur).fetchone()[0]


@pytest.mark.django_db
@pytest.mark.parametrize("cursor_kind", ["prepared (batch_cursor)", "Django's client-side cursor"])
@pytest.mark.parametrize(("sql_type", "values"), COLUMNS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(COLUMNS)])
def test_an_array_parameter_sent_as_its_text_reads_back_as_the_list_would(cursor_kind, sql_type, values):
    text = sql.array_text(values)
    assert isinstance(text, str), "every value here has a text form"
    prepared = cursor_kind.startswith("prepared")
    with batch_cursor() if prepared else connection.cursor() as cur:
        # The two ways a value reaches the server: bound as a parameter (the
        # text sent untyped, typed by the cast) or spliced into the text as a literal.
        assert isinstance(cur.cursor, psycopg.ClientCursor) is not prepared
        assert _read_back(cur, sql_type, text) == _read_back(cur, sql_type, list(values))


def test_a_column_with_a_value_array_text_does_not_know_goes_as_the_list():
    naive = datetime(2026, 12, 7, 19, 0)
    values = [datetime(2026, 12, 7, tzinfo=UTC), naive]
    assert sql.array_text(values) == values
    assert sql.array_text(iter([1.5])) == [1.5]


def test_rows_and_any_params_send_each_column_as_one_text():
    rows = [{"job_id": 1, "kind": 'say "hi"'}, {"job_id": 2, "kind": None}]
    params = sql.rows_params("g", [("job_id", "bigint"), ("kind", "text")], rows)
    assert params == {"g_job_id": "{1,2}", "g_kind": '{"say \\"hi\\"",NULL}'}
    assert sql.any_params("ops", ["ab", "c\\d"]) == {"ops": '{"ab","c\\\\d"}'}
