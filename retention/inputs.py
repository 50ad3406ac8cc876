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
  visible characters — graphic base characters by Unicode properties
  (``counts_as_visible``: letters, digits, punctuation and symbols that are
  not default-ignorable and have a glyph), so spaces, combining marks, the
  Hangul fillers, the braille blank U+2800 and U+1D159 do not count — and no
  format characters (Unicode ``Cf``: zero-width spaces and
  joiners U+200B-U+200D, U+2060, U+FEFF, the soft hyphen U+00AD, and the
  bidirectional overrides and isolates such as U+202E). One rule for every
  reason, whichever route it came by: a reason is what a later reader of the
  audit trail relies on, and text that renders as nothing or reorders itself
  on screen is not one.
- **Ids**: integers only, from 1 to ``MAX_ID`` (PostgreSQL's ``bigint``).
  In JSON an id is a JSON integer — ``"755"``, ``755.0``, ``1.5``, ``true``
  and ``1e400`` are refused, never rounded or coerced. In a query string or
  a form (where everything is a string) an id is 1 to 19 ASCII digits.
- **A customer's or a site's key** (``key_problem``) is its model's own: an
  integer key by the rules of ids; a UUID key a string its ``UUIDField``
  accepts (in JSON a string, never a number); a string key a string of at
  most its ``max_length``, with no control characters.

A problem is reported as a message that names the field; callers turn it
into a 400 or a form error. Nothing here touches the database.
"""

from __future__ import annotations

import argparse
import re
import unicodedata
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Model

from retention.domain import integer_key, key_of, portfolio_model, string_key

MAX_ID = 2**63 - 1
# The longest text taken as a customer's or a site's key that is not an integer
# (a UUID is 36 characters; retention.domain_checks caps a string key at 40).
MAX_KEY_TEXT = 64
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


# --- What counts as a visible character (the reason rule) ------------------------
#
# Decided by Unicode properties, not by a list of blanks someone has met:
#
# 1. The general category. Only graphic base characters count: letters (L*),
#    numbers (N*), punctuation (P*) and symbols (S*). Never: controls (Cc),
#    format characters (Cf), surrogates (Cs), private use (Co: renders as
#    whatever a font puts there, often nothing), unassigned code points (Cn:
#    unknown to this Python's Unicode database, so nothing a reader can be
#    shown to see), separators (Zs, Zl, Zp) and marks (Mn, Mc, Me).
# 2. Marks count only with a base, through the base: "é" counts once whether
#    it is one code point or "e" + U+0301, and marks with no base (ten U+0301,
#    ten enclosing circles U+20DD) count nothing. So a reason is counted in
#    user-perceived characters, not in code points a font stacks up.
# 3. Default_Ignorable_Code_Point (DerivedCoreProperties): code points a
#    renderer shows as nothing. The Cf and variation-selector members are
#    excluded by 1 already; the rest is the standard's own
#    Other_Default_Ignorable_Code_Point table (PropList.txt, unchanged since
#    Unicode 6.x), whose graphic members are the Hangul fillers U+115F,
#    U+1160, U+3164 and U+FFA0. Python's unicodedata lacks the property, so
#    the table is written out below, whole.
# 4. Graphic characters whose reference glyph is empty. No Unicode property
#    marks them (both are ordinary So symbols), so they are named: U+2800
#    BRAILLE PATTERN BLANK and U+1D159 MUSICAL SYMBOL NULL NOTEHEAD. Nothing
#    else in L/N/P/S outside 3 has an empty reference glyph.
_OTHER_DEFAULT_IGNORABLE = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x2065, 0x2065),
    (0x3164, 0x3164),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0000),
    (0xE0002, 0xE001F),
    (0xE0080, 0xE00FF),
    (0xE01F0, 0xE0FFF),
)
_EMPTY_GLYPHS = frozenset("\u2800\U0001d159")
_VISIBLE_CATEGORIES = frozenset("LNPS")


def default_ignorable(ch: str) -> bool:
    """Unicode's Default_Ignorable_Code_Point, for ``ch``."""
    cat = unicodedata.category(ch)
    if cat == "Cf" or "VARIATION SELECTOR" in unicodedata.name(ch, ""):
        # Cf and the variation selectors, less the few the property leaves out
        # (they show: prepended concatenation marks, interlinear annotations).
        return ch not in _DEFAULT_IGNORABLE_EXCEPTIONS
    point = ord(ch)
    return any(low <= point <= high for low, high in _OTHER_DEFAULT_IGNORABLE)


# Cf characters that are not default-ignorable (DerivedCoreProperties):
# prepended concatenation marks and the interlinear annotation characters,
# which render. Only ``default_ignorable`` reads this; the reason rule
# refuses every Cf anyway.
_DEFAULT_IGNORABLE_EXCEPTIONS = frozenset(
    "\u0600\u0601\u0602\u0603\u0604\u0605\u06dd\u070f\u0890\u0891\u08e2"
    "\ufff9\ufffa\ufffb"
    "\U000110bd\U000110cd"
    "\U00013430\U00013431\U00013432\U00013433\U00013434\U00013435\U00013436\U00013437\U00013438"
)


def counts_as_visible(ch: str) -> bool:
    """Whether ``ch`` is one visible character of a reason (see above)."""
    if unicodedata.category(ch)[0] not in _VISIBLE_CATEGORIES or ch in _EMPTY_GLYPHS:
        return False
    return not default_ignorable(ch)


def visible_length(text: str) -> int:
    """How many characters of ``text`` a reader sees: graphic base characters
    (letters, digits, punctuation, symbols) that are not default-ignorable and
    have a glyph; spaces, marks, format, private-use and unassigned code
    points count nothing."""
    return sum(1 for ch in text if counts_as_visible(ch))


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


#: The reason rule in words, for a form's help text and the API schema's ``description``.
REASON_RULE = (
    f"At least {MIN_REASON_LENGTH} visible characters, counted by Unicode properties: letters, digits,"
    " punctuation and symbols that are not default-ignorable and have a glyph (spaces, combining marks,"
    " fillers and invisible characters count nothing); no format characters (zero-width spaces, soft"
    f" hyphens, direction overrides) and no control characters; at most {MAX_TEXT_LENGTH} characters."
    " It goes into the audit trail."
)

#: The JSON types a request body's field may be required to have (``json_type_problem``).
JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "boolean": (bool,)}


def _json_type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction or an exponent"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def json_type_problem(value: Any, *, field: str, expected: str) -> str | None:
    """Why ``value`` (from a JSON body) is not of the JSON type ``expected``
    (a key of ``JSON_TYPES``), or ``None``. Never coerced: ``"30"`` is not an
    integer, ``30.0`` and ``true`` are not either, ``30`` is not a string."""
    types = JSON_TYPES[expected]
    if isinstance(value, types) and (expected == "boolean" or not isinstance(value, bool)):
        return None
    article = "an" if expected[0] in "aeiou" else "a"
    return f"{field} must be {article} JSON {expected}, not {_json_type_of(value)}."


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


def key_problem(value: Any, *, model: type[Model], field: str, from_form: bool) -> str | None:
    """Why ``value`` is not a key of ``model`` (the host's customer or site
    model, ``retention.domain``), or ``None``: an integer key by
    ``id_problem``'s rules; a UUID or a string key as a string (a JSON
    string in a body), which the key's own field must accept."""
    if integer_key(model):
        return id_problem(value, field=field, from_form=from_form)
    what = "a key (a string)" if string_key(model) else "a UUID"
    if not isinstance(value, str):
        return f"{field} must be {what}, not {_json_type_of(value)}."
    if not value or len(value) > MAX_KEY_TEXT or text_problem(value, field=field, max_length=MAX_KEY_TEXT):
        return f"{field} must be {what}."
    try:
        key_of(model, value)
    except ValidationError:
        return f"{field} must be {what}."
    return None


def key_check(value: Any, *, model: type[Model], field: str, from_form: bool) -> Any:
    """``value`` as ``model``'s key, else ``InputError`` naming ``field`` (``key_problem``)."""
    problem = key_problem(value, model=model, field=field, from_form=from_form)
    if problem is not None:
        raise InputError(field, problem)
    return int(value) if integer_key(model) else key_of(model, value)


def key_or_none(value: Any, *, model: type[Model]) -> Any:
    """``value`` (text: a form's, a query string's, an audit event's object id) as ``model``'s key, or None."""
    if key_problem(value, model=model, field="key", from_form=True) is not None:
        return None
    return key_check(value, model=model, field="key", from_form=True)


def portfolio_key_argument(text: str) -> Any:
    """A command's ``--portfolio``: the customer model's key (an integer, a UUID…), an argparse type."""
    problem = key_problem(text, model=portfolio_model(), field="--portfolio", from_form=True)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return key_check(text, model=portfolio_model(), field="--portfolio", from_form=True)
