"""Issue, list and revoke a user's API tokens (django-rest-knox: hashed at rest, each with an expiry).

``cleanup_api_token issue scheduler [--days 90]`` prints the new token once, on
standard output alone (for ``TOKEN=$(…)``); it is stored nowhere but as a
digest, so a lost token is revoked and issued anew. ``list scheduler`` prints
each token's id (its first characters), when it was issued and when it
expires; ``revoke scheduler <id>`` deletes one. Every issue and revocation is
an audit event naming the token's id, never the token.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.api_tokens import MAX_TTL, TokenNotFound, api_token_issue, api_token_revoke
from cleanup_ops.selectors import api_tokens_of


class Command(BaseCommand):
    help = "Issue (printing it once), list or revoke a user's API tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        issue = sub.add_parser("issue", help="issue a token and print it (once)")
        issue.add_argument("username")
        issue.add_argument(
            "--days",
            type=int,
            default=None,
            help=f"days until it expires (1 to {MAX_TTL.days}; default API_TOKEN_TTL_DAYS)",
        )
        listing = sub.add_parser("list", help="the user's tokens: id, issued, expires")
        listing.add_argument("username")
        revoke = sub.add_parser("revoke", help="delete one of the user's tokens by its id")
        revoke.add_argument("username")
        revoke.add_argument("token_id")

    def handle(self, *args: Any, **options: Any) -> None:
        model = get_user_model()
        try:
            user = model._default_manager.get_by_natural_key(options["username"])
        except model.DoesNotExist:
            raise CommandError(f"no user {options['username']!r}") from None
        if options["action"] == "issue":
            days = options["days"]
            if days is not None and not 1 <= days <= MAX_TTL.days:
                raise CommandError(f"--days: must be from 1 to {MAX_TTL.days}, got {days}")
            try:
                issued = api_token_issue(user=user, ttl=None if days is None else timedelta(days=days))
            except ValidationError as exc:
                raise CommandError("; ".join(exc.messages)) from None
            # The token alone on standard output; what it is, on standard error.
            self.stderr.write(
                f"token {issued.token_id}… for {user.get_username()}, expires {issued.expiry.isoformat()}"
            )
            self.stdout.write(issued.secret)
        elif options["action"] == "list":
            for token in api_tokens_of(user=user):
                expiry = token.expiry.isoformat() if token.expiry else "never"
                self.stdout.write(f"{token.token_key}\tissued {token.created.isoformat()}\texpires {expiry}")
        else:
            try:
                api_token_revoke(user=user, token_id=options["token_id"])
            except TokenNotFound:
                raise CommandError(f"{user.get_username()} has no token {options['token_id']!r}") from None
            self.stderr.write(f"revoked {options['token_id']}")
