"""An S3 storage's purges build their clients from one boto3 session a process."""

from __future__ import annotations

from typing import Any

from storages.backends.s3 import S3Storage

from cleanup_ops.downstream.stores import S3Store


def counted_storage(sessions: list[str], name: str) -> S3Storage:
    """An S3 storage that records each boto3 session it is asked to make."""
    storage = S3Storage(
        bucket_name="contracts",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:9",
        access_key="test",
        secret_key="test",
    )
    create = storage._create_session

    def counting() -> Any:
        sessions.append(name)
        return create()

    storage._create_session = counting  # type: ignore[method-assign]
    return storage


def test_the_purge_requests_of_one_storage_share_one_boto3_session_and_another_storage_gets_its_own():
    sessions: list[str] = []
    contracts, photos = counted_storage(sessions, "contracts"), counted_storage(sessions, "photos")
    clients = []
    for storage in (contracts, contracts, contracts, photos, photos):
        store = S3Store("a", storage)  # one per purge request, as store_for makes it
        clients.append(store._client)
        store.close()
    assert sessions == ["contracts", "photos"]
    # Each request still has a client of its own: our timeouts, no botocore retries.
    assert len({id(client) for client in clients}) == 5
    assert all(client.meta.config.retries["total_max_attempts"] == 1 for client in clients)
