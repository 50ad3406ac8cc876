"""The API's tokens: issued with an expiry, hashed at rest, listed and revoked by their owner.

The tokens are django-rest-knox's (``knox.models.AuthToken``): the table holds
a SHA-512 digest of each secret and its first characters (``token_key``,
knox's lookup prefix), never the secret itself. A token is shown once, when
it is issued (``cleanup_api_token issue``); afterwards it is known by its
``token_key`` alone — its id in the API's list (``/api/v1/tokens/``), in the
revocation URL and in the audit trail. Every token expires: an expiry of
``API_TOKEN_TTL_DAYS`` (90 days) unless issued with another one, between
``MIN_TTL`` and ``MAX_TTL``. An expired token answers 401 (knox deletes it on
that request); a revoked one is deleted at once.

Services (writes, each with its audit event naming the token's id only):
``api_token_issue``, ``api_token_revoke``. The reads are
``cleanup_ops.selectors.api_tokens_of``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from knox.models import AuthToken

from retention.actors import Actor
from retention.services import audit_event_record

MIN_TTL = timedelta(hours=1)
MAX_TTL = timedelta(days=3650)
AUDIT_OBJECT_TYPE = "api_token"


class TokenNotFound(Exception):
    """No token of that id belongs to that user (another user's token is not found either)."""


@dataclass(frozen=True)
class IssuedToken:
    """A token just issued: ``secret`` is shown this once and stored nowhere."""

    token_id: str
    secret: str
    expiry: datetime


def default_ttl() -> timedelta:
    return timedelta(days=settings.API_TOKEN_TTL_DAYS)


def api_token_issue(*, user: Actor, ttl: timedelta | None = None, issued_by: Actor | None = None) -> IssuedToken:
    """A new token for ``user`` expiring ``ttl`` from now (default ``API_TOKEN_TTL_DAYS``)."""
    ttl = default_ttl() if ttl is None else ttl
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise ValidationError({"ttl": f"a token's lifetime must be from {MIN_TTL} to {MAX_TTL.days} days, got {ttl}"})
    with transaction.atomic():
        token, secret = AuthToken.objects.create(user=user, expiry=ttl)
        assert token.expiry is not None
        audit_event_record(
            actor=issued_by,
            action="api_token.issue",
            object_type=AUDIT_OBJECT_TYPE,
            object_id=token.token_key,
            details={"user_id": user.pk, "expiry": token.expiry.isoformat()},
        )
    return IssuedToken(token_id=token.token_key, secret=secret, expiry=token.expiry)


def api_token_revoke(*, user: Actor, token_id: str, revoked_by: Actor | None = None) -> None:
    """Delete ``user``'s token ``token_id``; ``TokenNotFound`` when ``user`` has no such token."""
    with transaction.atomic():
        deleted, _ = AuthToken.objects.filter(user=user, token_key=token_id).delete()
        if not deleted:
            raise TokenNotFound(token_id)
        audit_event_record(
            actor=revoked_by,
            action="api_token.revoke",
            object_type=AUDIT_OBJECT_TYPE,
            object_id=token_id,
            details={"user_id": user.pk},
        )
