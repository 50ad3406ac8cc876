"""The document store's client builds its TLS context once a process, not once a client."""

from __future__ import annotations

import ssl

import pytest

from cleanup_ops.downstream import client as docstore_client


@pytest.fixture
def default_contexts_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the default TLS contexts built (each loads the whole root store)."""
    built: list[int] = []
    create = ssl.create_default_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        built.append(1)
        return create(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    docstore_client.tls_context.cache_clear()
    yield built
    docstore_client.tls_context.cache_clear()


@pytest.mark.parametrize("url", ["http://127.0.0.1:9", "https://docs.example.test"])
def test_a_process_builds_one_tls_context_however_many_clients_it_makes(settings, default_contexts_built, url):
    settings.DOCSTORE_URL = url
    settings.DOCSTORE_ALLOWED_HOSTS = ["127.0.0.1", "docs.example.test"]
    for _ in range(3):
        with docstore_client.DocstoreClient():
            pass
    assert len(default_contexts_built) == 1


def test_the_shared_tls_context_verifies_the_certificate_and_the_host_name():
    context = docstore_client.tls_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # certifi's roots, as httpx's own default
