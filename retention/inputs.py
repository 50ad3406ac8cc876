"""What the product accepts as free text and as an id, defined once.

Every route that takes text or an id from a request — the console's forms
and filters, the admin's forms and changelist parameters, both APIs — checks
it with these functions, and the services check free text again, so a
request can never write what a form would have refused:

- **Free text** (reasons, review notes, filter values): at most
  ``MAX_TEXT_LENGTH`` characters (a reason or note) or the field's own
  maximum (a filter on a 60-character column), and no control characters —
  Unicode category ``Cc`` except tab, line feed and carriage return, which a
  textarea sends. NUL in particular never reaches the database (PostgreSQL
  refuses it in text).
- **Reasons** (a decision's reason, a review note, a hold's reason and its
  release's): free text as above, *and* at least ``MIN_REASON_LENGTH``
  visible characters — letters, digits, punctuation and symbols, so spaces,
  combining marks and blank "letters" such as U+3164 (Hangul filler) do not
  count — and no format characters (Unicode ``Cf``: zero-width spaces and
  joiners U+200B-U+200D, U+2060, U+FEFF, the soft hyphen U+00AD, and the
  bidirectional overrides and isolates such as U+202E). One rule for every
  reason, whichever route it came by: a reason is what a later reader of the
  audit trail relies on, and text that renders as nothing or reorders itself
  on screen is not one.
- **Ids**: integers only, from 1 to ``MAX_ID`` (PostgreSQL's ``bigint``).
  In JSON an id is a JSON integer — ``"755"``, ``755.0``, ``1.5``, ``true``
  and ``1e400`` are refused, never rounded or coerced. In a query string or
  a form (where everything is a string) an id is 1 to 19 ASCII digits.

A problem is reported as a message that names the field; callers turn it
into a 400 or a form error. Nothing here touches the database.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

MAX_ID = 2**63 - 1
#: The longest reason or note the product stores (audit trail included).
MAX_TEXT_LENGTH = 2000
#: The fewest visible characters a reason or a review note may have (``reason_problem``).
MIN_REASON_LENGTH = 10
#: The longest search term or free-text filter value the console and admin take.
MAX_FILTER_LENGTH = 200

_ALLOWED_CONTROLS = frozenset("\t\n\r")
#: The same rule as a regular expression (category Cc is U+0000-001F and
#: U+007F-009F), for validators whose pattern ends up in the OpenAPI schema.
CONTROL_FREE_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]*$"
_DIGITS = re.compile(r"[0-9]{1,19}")


class InputError(ValueError):
    """A value that is not acceptable; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def has_control_characters(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" and ch not in _ALLOWED_CONTROLS for ch in text)


def text_problem(value: str, *, field: str, max_length: int = MAX_TEXT_LENGTH) -> str | None:
    """Why ``value`` is not acceptable free text for ``field``, or ``None``."""
    if len(value) > max_length:
        return f"{field} must be at most {max_length} characters (got {len(value)})."
    if has_control_characters(value):
        return f"{field} must not contain control characters (such as NUL)."
    return None


# Letters the Unicode standard classes as letters (Lo) but that render blank:
# the Hangul fillers and the braille blank. They do not count as visible.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
_VISIBLE_CATEGORIES = frozenset("LNPS")


def visible_length(text: str) -> int:
    """How many characters of ``text`` a reader sees: letters, digits,
    punctuation and symbols, not spaces, marks, format characters or blanks."""
    return sum(1 for ch in text if unicodedata.category(ch)[0] in _VISIBLE_CATEGORIES and ch not in _BLANK_LETTERS)


def reason_problem(value: str, *, field: str, min_length: int = MIN_REASON_LENGTH) -> str | None:
    """Why ``value`` is not an acceptable reason (or review note) for ``field``, or ``None``."""
    problem = text_problem(value, field=field)
    if problem is not None:
        return problem
    if any(unicodedata.category(ch) == "Cf" for ch in value):
        return (
            f"{field} must not contain invisible formatting characters"
            " (zero-width spaces, soft hyphens, direction overrides)."
        )
    if visible_length(value) < min_length:
        return (
            f"{field} must have at least {min_length} visible characters; it goes into the audit trail"
            " (spaces and invisible characters do not count)."
        )
    return None


def text_check(value: str, *, field: str, max_length: int = MAX_TEXT_LENGTH) -> str:
    """``value`` if acceptable, else ``InputError`` naming ``field``."""
    problem = text_problem(value, field=field, max_length=max_length)
    if problem is not None:
        raise InputError(field, problem)
    return value


def id_problem(value: Any, *, field: str, from_form: bool) -> str | None:
    """Why ``value`` is not an id, or ``None``. ``from_form``: it came from a
    query string or a form, where an id is a string of digits."""
    if from_form and isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            return f"{field} must be an integer id (1 to 19 digits)."
        value = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        return f"{field} must be an integer id (a JSON integer, not a string, a float or a boolean)."
    if not 1 <= value <= MAX_ID:
        return f"{field} must be an id between 1 and 2^63-1."
    return None


def id_check(value: Any, *, field: str, from_form: bool) -> int:
    problem = id_problem(value, field=field, from_form=from_form)
    if problem is not None:
        raise InputError(field, problem)
    return int(value)
