"""Sorted, two-way keyset pagination with the page's position, for the jobs
and dead-letter lists.

A list is sorted by one whitelisted, non-null column (``sort=<name>`` or
``sort=-<name>`` for descending), ties broken by the id in the same
direction, so the order is total. Pages are reached from a row: ``after=<id>``
is the page that follows row ``id`` in that order, ``before=<id>`` the page
that precedes it, ``last=yes`` the last page. A boundary row is named by its
id only; its sort value is read by a subquery, so a link never carries a
value to parse. A boundary row that is gone, not in the list any more, or
not the reader's to see gives the first page, never an error.

Every page costs three queries whatever its depth: the count, the page, and
its position (the rows before its first one), which reads as "51 to 100 of 734".

A nullable column (a property, a store's HTTP status) is sorted through an
expression that never is NULL (``Coalesce(..., 0)``: "none" first going up),
annotated on the list under ``sort_<name>``, so the keyset comparisons hold.

``per_page`` chooses the page's size, from 1 to ``PER_PAGE_MAX``; anything
else is a ``FilterError`` naming the parameter (the console's 400 page).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import Expression, Q, QuerySet, Subquery

from retention.filters import FilterError, choice_param, id_param

PER_PAGE_MAX = 200


def page_size_parse(params: Mapping[str, Any], *, default: int) -> int:
    """``per_page``: a whole number from 1 to ``PER_PAGE_MAX``; ``default`` when absent."""
    raw = params.get("per_page")
    if raw in (None, ""):
        return default
    text = str(raw)
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= PER_PAGE_MAX:
        raise FilterError("per_page", f"per_page must be a whole number from 1 to {PER_PAGE_MAX}.")
    return int(text)


@dataclass(frozen=True)
class Sort:
    name: str  # the parameter's word
    field: str  # the model field, or the annotation of ``expression``
    descending: bool
    expression: Expression | None = None  # a nullable column's non-null stand-in

    @property
    def param(self) -> str:
        return f"-{self.name}" if self.descending else self.name

    def ordering(self, *, reverse: bool = False) -> list[str]:
        down = self.descending != reverse
        return [f"-{self.field}", "-id"] if down else [self.field, "id"]

    def toggled(self, name: str) -> str:
        """The ``sort`` a column header links to: this column, the other way
        if it is the current one, else descending first for numbers and times."""
        if name == self.name:
            return name if self.descending else f"-{name}"
        return f"-{name}"


def sort_parse(params: Mapping[str, Any], columns: Mapping[str, str | Expression], *, default: str) -> Sort:
    """``sort`` among ``columns`` (word → field, or an expression that is
    never NULL), optionally with a leading ``-``."""
    raw = params.get("sort") or default
    name = str(raw).removeprefix("-")
    if choice_param({"sort": name}, "sort", list(columns), strict=True) is None:
        raise FilterError("sort", f"sort must name a column: {', '.join(columns)} (a leading - for descending).")
    column = columns[name]
    descending = str(raw).startswith("-")
    if isinstance(column, str):
        return Sort(name=name, field=column, descending=descending)
    return Sort(name=name, field=f"sort_{name}", descending=descending, expression=column)


def sorted_rows(queryset: QuerySet[Any], sort: Sort) -> QuerySet[Any]:
    """``queryset`` with ``sort``'s annotation (if it has one), unordered."""
    return queryset.annotate(**{sort.field: sort.expression}) if sort.expression is not None else queryset


@dataclass
class KeysetPage:
    rows: list[Any]
    count: int
    start: int  # 1-based position of the first row (0 when empty)
    sort: Sort
    first_id: int | None
    last_id: int | None
    has_previous: bool
    has_next: bool

    @property
    def end(self) -> int:
        return self.start + len(self.rows) - 1 if self.rows else 0

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _beyond(listed: QuerySet[Any], sort: Sort, boundary: int, *, forward: bool) -> Q:
    """Rows after (``forward``) or before row ``boundary`` in ``sort``'s order.

    The boundary's value is read from ``listed`` (the filtered, scoped list),
    never from the whole table: a row the reader may not see (another
    customer's) positions nothing and answers like a missing id."""
    value = Subquery(listed.filter(pk=boundary).order_by().values(sort.field)[:1])
    later = sort.descending != (not forward)  # moving toward smaller values?
    op = "lt" if later else "gt"
    return Q(**{f"{sort.field}__{op}": value}) | Q(**{sort.field: value, f"id__{op}": boundary})


def keyset_page(queryset: QuerySet[Any], params: Mapping[str, Any], *, sort: Sort, size: int) -> KeysetPage:
    """The page of ``queryset`` (already filtered and scoped) that ``after``,
    ``before`` or ``last`` in ``params`` ask for."""
    queryset = sorted_rows(queryset, sort)
    after = id_param(params, "after", strict=True)
    before = id_param(params, "before", strict=True)
    last = choice_param(params, "last", ["yes"], strict=True) == "yes"
    count = queryset.count()
    reverse = False
    page_qs = queryset
    if after is not None:
        page_qs = queryset.filter(_beyond(queryset, sort, after, forward=True))
    elif before is not None:
        page_qs, reverse = queryset.filter(_beyond(queryset, sort, before, forward=False)), True
    elif last:
        reverse = True
    rows = list(page_qs.order_by(*sort.ordering(reverse=reverse))[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    if reverse:
        rows.reverse()
    if not rows and (after is not None or before is not None):
        # The boundary row is gone (or the list shrank past it): the first page.
        rows = list(queryset.order_by(*sort.ordering())[: size + 1])
        more, rows, reverse, after, before = len(rows) > size, rows[:size], False, None, None
    start = 0
    if rows:
        first_page = after is None and before is None and not last
        start = 1 if first_page else 1 + queryset.filter(_beyond(queryset, sort, rows[0].pk, forward=False)).count()
    has_previous = start > 1
    has_next = (more if not reverse else (start + len(rows) - 1 < count)) if rows else False
    return KeysetPage(
        rows=rows,
        count=count,
        start=start,
        sort=sort,
        first_id=rows[0].pk if rows else None,
        last_id=rows[-1].pk if rows else None,
        has_previous=has_previous,
        has_next=has_next,
    )
