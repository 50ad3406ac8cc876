"""``seed_attachments``: upload demo attachments to the document store and link them to records."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.downstream.client import DocstoreClient
from cleanup_ops.recovery.classification import (
    DownstreamConnectionError,
    DownstreamError,
    DownstreamTimeout,
    InvalidInput,
)
from demo.services import SeedError, record_attachments_seed


class Command(BaseCommand):
    help = "Demo: upload attachments to the document store (DOCSTORE_URL) and link them to records."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--fraction", type=float, default=0.1, help="share of leases and maintenance records")
        parser.add_argument("--seed", type=int, default=42)

    def handle(self, *args: object, **options: object) -> None:
        try:
            with DocstoreClient() as client:
                ids = record_attachments_seed(
                    fraction=options["fraction"],
                    seed=options["seed"],
                    upload=lambda doc: _upload(client, doc),
                )
        except SeedError as exc:
            raise CommandError(str(exc)) from None
        except InvalidInput as exc:
            raise CommandError(f"DOCSTORE_URL: {exc}") from None
        except (DownstreamError, DownstreamTimeout, DownstreamConnectionError) as exc:
            raise CommandError(f"document store at DOCSTORE_URL failed: {type(exc).__name__} {exc}") from None
        self.stdout.write(f"Uploaded {len(ids)} attachments to the document store and linked them to their records.")


def _upload(client: DocstoreClient, document_id: str) -> None:
    # The store has its own rate limit: wait as long as its 429 says, a few times.
    for _ in range(10):
        try:
            client.put_document(document_id, b"demo attachment", idempotency_key=f"seed:{document_id}")
            return
        except DownstreamError as exc:
            if exc.status != 429:
                raise
            retry_after = exc.retry_after or "1"
            time.sleep(min(5.0, float(retry_after)) if retry_after.isdigit() else 1.0)
    raise DownstreamError(429)
