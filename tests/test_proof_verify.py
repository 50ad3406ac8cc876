"""The proof export carries every operation id's inputs, and
``manage.py cleanup_proof_verify FILE --public-key KEYS`` (or ``python
cleanup_ops/proof_verify.py FILE --public-key KEYS``, no Django) recomputes every
operation id and digest from the file alone (issue 30, item 17). The export is
signed (issue 39, item 1): an edit to any field, or a proof written by hand,
fails; an untouched one verifies with the published public keys alone."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from cleanup_ops.execution.batches import operation_id
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, LedgerEntry, Sweep
from cleanup_ops.proof import proof_sign, sweep_proof
from cleanup_ops.proof_keys import DEMO_KEY_ID, proof_public_keys
from cleanup_ops.proof_verify import (
    Report,
    canonical_json,
    job_digest,
    public_keys_read,
    sweep_digest,
    verify,
    verify_json_signature,
    verify_text,
)
from cleanup_ops.proof_verify import operation_id as verifier_operation_id
from cleanup_ops.schedule import sweep_trigger
from properties.models import Property

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
SLOT = utc("2026-08-21T02:00:00Z")
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def exported(portfolio, prop, active_policy, operator_user, tmp_path, time_machine):  # type: ignore[no-untyped-def]
    """A sweep of two partitions deleted in batches of 2, exported as JSON and CSV over HTTP."""
    time_machine.move_to(utc("2026-08-21T02:05:00Z"), tick=False)
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "maintenance_record", 365)
    make_records(prop, "lease", 5, ended=OLD)
    make_records(Property.objects.create(portfolio=portfolio, name="Quay Court"), "maintenance_record", 3, ended=OLD)
    sweep_trigger(slot=SLOT)
    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, batch_size=2)
    assert LedgerEntry.objects.count() == 3 + 2
    sweep = Sweep.objects.get()
    client = Client()
    # The public keys as an auditor gets them: anonymously, from the published URL.
    keys = Client().get("/api/v1/proof-keys/")
    assert keys.status_code == 200
    files = {"keys": tmp_path / "proof-keys.json"}
    files["keys"].write_bytes(keys.content)
    client.force_login(operator_user)
    for fmt in ("json", "csv"):
        response = client.get(f"/console/sweeps/{sweep.pk}/proof.{fmt}")
        assert response.status_code == 200
        files[fmt] = tmp_path / f"proof.{fmt}"
        files[fmt].write_bytes(response.content)
    return files


def test_the_export_states_each_operation_ids_inputs_and_they_recompute_to_the_ledgers_ids(exported) -> None:
    proof = json.loads(exported["json"].read_text())
    assert proof["slot"] == "2026-08-21T02:00:00Z"
    stated = {op["operation_id"] for p in proof["partitions"] for op in p["operation_inputs"]}
    assert stated == set(LedgerEntry.objects.values_list("operation_id", flat=True))
    for partition in proof["partitions"]:
        for op in partition["operation_inputs"]:
            entry = LedgerEntry.objects.get(operation_id=op["operation_id"])
            assert (op["after_id"], op["limit"]) == (entry.after_id, entry.batch_limit)
            args = {
                "record_kind": partition["record_kind"],
                "property_id": partition["property_id"],
                "after_id": op["after_id"],
                "limit": op["limit"],
            }
            # The verifier's own formula agrees with the one the batch path uses.
            assert verifier_operation_id(slot=proof["slot"], cutoff=op["cutoff"], **args) == op["operation_id"]
            assert operation_id(slot=SLOT, cutoff=entry.cutoff, **args) == op["operation_id"]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_the_verifier_recomputes_every_digest_of_an_untouched_export(exported, fmt: str, capsys) -> None:
    call_command("cleanup_proof_verify", str(exported[fmt]), "--public-key", str(exported["keys"]))
    out = capsys.readouterr().out
    assert "verified: signature valid under key test-2026; 2 job digests, 5 operation ids recomputed" in out


def test_the_verifier_runs_without_django_or_a_database(exported) -> None:
    # The standard library and cryptography: run from outside the project, with no settings.
    done = subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [
            sys.executable,
            "-I",
            str(ROOT / "cleanup_ops" / "proof_verify.py"),
            str(exported["csv"]),
            "--public-key",
            str(exported["keys"]),
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env={},
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("5 operation ids recomputed")


def test_a_changed_input_a_dropped_operation_or_a_changed_digest_fails_naming_the_job(exported, capsys) -> None:
    proof = json.loads(exported["json"].read_text())
    first, second = proof["partitions"]
    first["operation_inputs"][1]["after_id"] += 1  # claims another slice than the one deleted
    second["operation_inputs"].pop()  # hides an operation
    path = exported["json"].with_name("tampered.json")
    path.write_text(json.dumps(proof))
    with pytest.raises(CommandError) as raised:
        call_command("cleanup_proof_verify", str(path), "--public-key", str(exported["keys"]))
    assert raised.value.returncode == 1
    out = capsys.readouterr().out
    assert f"job {first['job_id']}: the operation after id {first['operation_inputs'][1]['after_id']}" in out
    assert f"job {second['job_id']}: 2 operations stated, 1 with inputs" in out
    assert "sweep: digest recomputes to" in out

    text = exported["csv"].read_text().replace(proof["digest"], "0" * 64)
    path = exported["csv"].with_name("tampered.csv")
    path.write_text(text)
    with pytest.raises(CommandError):
        call_command("cleanup_proof_verify", str(path), "--public-key", str(exported["keys"]))
    assert "sweep: digest recomputes to" in capsys.readouterr().out


def test_a_file_that_is_not_a_proof_is_refused_with_a_clear_message(tmp_path, capsys) -> None:
    path = tmp_path / "nonsense.json"
    path.write_text("{not json")
    keys = tmp_path / "keys.json"
    keys.write_text(Client().get("/api/v1/proof-keys/").content.decode())
    with pytest.raises(CommandError):
        call_command("cleanup_proof_verify", str(path), "--public-key", str(keys))
    assert "not a readable proof export" in capsys.readouterr().out


# --- The signature (issue 39, item 1) ---------------------------------------------------


def leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every leaf of a JSON document by its path; an empty list or object is a leaf too."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list) and node:
        for index, value in enumerate(node):
            yield from leaves(value, (*path, index))
    else:
        yield path, node


def changed(value: Any) -> Any:
    """Another value of the same kind (a count one more, a text one character longer...)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + "0"
    if value is None:
        return 0
    return [0] if isinstance(value, list) else {"extra": 0}


def copy_json(document: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(document))


Container = dict[Any, Any] | list[Any]
Edit = Callable[[Container, Any], None]


def edits_of(value: Any) -> tuple[tuple[str, Edit], ...]:
    """The three edits of a leaf holding ``value``, each made on the leaf's container."""

    def change(node: Container, key: Any) -> None:
        node[key] = changed(value)

    def remove(node: Container, key: Any) -> None:
        node.pop(key)

    def rename(node: Container, key: Any) -> None:
        if isinstance(node, dict):
            node[f"{key}_"] = node.pop(key)
        else:
            node.append(node[key])

    return (("changed", change), ("removed", remove), ("renamed", rename))


def shape_of(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """A leaf's field, whichever list element it is in: ``("partitions", "*", "rows_deleted")``."""
    return tuple("*" if isinstance(step, int) else step for step in path)


def assert_every_field_is_covered(document: dict[str, Any], keys: Any) -> int:
    """Change, remove and rename each leaf of a signed JSON proof in turn: each must fail on its signature.

    Every edit of every leaf goes through the signature check (``verify_json_signature``,
    which is what covers a field); the first edit of each kind of each field (``shape_of``:
    one drop's ``rows`` for all of them) also goes through the whole ``verify``, which must
    fail naming the signature. The rest skip recomputing every operation id and digest,
    most of a verification's time on a proof of a hundred table partitions, which would
    not change their verdict: the signature problem is the one ``verify`` reports
    first, from the same check. Each edit is made on the document and undone (its
    container put back), not made on a copy of the whole document."""
    assert verify(document, keys=keys).ok, verify(document, keys=keys).problems
    document = copy_json(document)  # edited in place below: never the caller's objects
    before = canonical_json(document)
    whole: set[tuple[str, tuple[Any, ...]]] = set()
    edits = 0
    for path, value in list(leaves(document)):
        node: Any = document
        for step in path[:-1]:
            node = node[step]
        for name, edit in edits_of(value):
            kept = copy.copy(node)
            edit(node, path[-1])
            if (name, shape_of(path)) not in whole:
                whole.add((name, shape_of(path)))
                report = verify(document, keys=keys)
            else:
                report = Report()
                verify_json_signature(document, keys, report)
            assert not report.ok, f"{name} {path}: still verifies"
            assert any(p.startswith("signature") for p in report.problems), (name, path, report.problems)
            if isinstance(node, dict):
                node.clear()
                node.update(kept)
            else:
                node[:] = kept
            edits += 1
    assert canonical_json(document) == before  # every edit undone: each was checked alone
    return edits


def test_a_proof_edited_in_any_field_fails_and_names_the_signature(exported) -> None:
    document = json.loads(exported["json"].read_text())
    keys = public_keys_read([str(exported["keys"])])
    paths = [path for path, _ in leaves(document)]
    # The fields the issue names are among the leaves, per job and per sweep.
    for field in ("rows_deleted", "portfolio_id", "policy_version_id", "state", "outcome", "cutoff"):
        assert ("partitions", 0, field) in paths
    assert ("partitions", 0, "operation_inputs", 0, "last_id") in paths
    assert ("attachments", "documents_purged") in paths
    assert ("rows_deleted",) in paths and ("signature", "key_id") in paths
    assert assert_every_field_is_covered(document, keys) == 3 * len(paths)


def test_a_csv_proof_edited_in_any_character_fails(exported) -> None:
    keys = public_keys_read([str(exported["keys"])])
    text = exported["csv"].read_bytes().decode()
    assert verify_text(text, keys=keys).ok
    assert "\r\n" in text  # the CSV module's rows; the signature covers them read as LF
    for index, char in enumerate(text):
        other = "1" if char == "0" else "0"
        report = verify_text(text[:index] + other + text[index + 1 :], keys=keys)
        assert not report.ok, f"character {index} ({char!r}) changed: still verifies"
    # Lines added after the signature, or the signature line removed: not signed.
    for tampered in (text + "# rows_deleted 0\n", text[: text.rindex("# signature")]):
        assert "signature: the export is not signed" in verify_text(tampered, keys=keys).problems[0]


def hand_written(slot: str) -> dict[str, Any]:
    """A proof of a sweep that never ran, every digest recomputed right."""
    op = verifier_operation_id(
        record_kind="lease", property_id="7", slot=slot, cutoff="2025-01-01T00:00:00Z", after_id="0", limit=1000
    )
    job = job_digest([op])
    partition = {
        "job_id": 1,
        "portfolio_id": 1,
        "property_id": 7,
        "record_kind": "lease",
        "rows_deleted": 1000,
        "operations": 1,
        "digest": job,
        "operation_inputs": [
            {"operation_id": op, "after_id": 0, "last_id": 1000, "limit": 1000, "cutoff": "2025-01-01T00:00:00Z"}
        ],
    }
    return {"slot": slot, "jobs": 1, "rows_deleted": 1000, "digest": sweep_digest([job]), "partitions": [partition]}


def test_a_hand_written_proof_fails_unsigned_or_signed_with_another_key(exported, tmp_path) -> None:
    keys = public_keys_read([str(exported["keys"])])
    forged = hand_written("2026-08-21T02:00:00Z")
    report = verify(forged, keys=keys)
    assert report.jobs == 1 and report.problems == ["signature: the export is not signed (no signature block)"]
    # Signed with a key of the forger's own, naming the platform's key id.
    mine = Ed25519PrivateKey.generate()
    pem = mine.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with override_settings(RETENTION_PROOF_SIGNING_KEY=pem.decode(), RETENTION_PROOF_KEY_ID="test-2026"):
        signed = proof_sign(proof=forged)
    (problem,) = verify(signed, keys=keys).problems
    assert problem.startswith("signature: invalid under key test-2026")
    # The same, through the command: exit 1 naming the signature.
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(signed, indent=2))
    done = subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [
            sys.executable,
            "-I",
            str(ROOT / "cleanup_ops" / "proof_verify.py"),
            str(path),
            "--public-key",
            str(exported["keys"]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "signature: invalid under key test-2026" in done.stdout


def test_an_unknown_key_id_is_named_and_a_rotated_key_still_verifies_its_proofs(exported, tmp_path) -> None:
    sweep = Sweep.objects.get()
    old_proof = json.loads(exported["json"].read_text())
    # Rotation: a new key under a new id; the old one's entry moves to the retired key set.
    retired = tmp_path / "retired.json"
    retired.write_text(exported["keys"].read_text())
    new = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with override_settings(
        RETENTION_PROOF_SIGNING_KEY=new.decode(),
        RETENTION_PROOF_KEY_ID="test-2027",
        RETENTION_PROOF_PUBLIC_KEYS=str(retired),
    ):
        published = Client().get("/api/v1/proof-keys/").json()
        new_proof = proof_sign(proof=sweep_proof(sweep=sweep))
        assert call_command_output("cleanup_proof_key", "--pem").startswith("-----BEGIN PUBLIC KEY-----")
    assert [(k["key_id"], k["current"]) for k in published["keys"]] == [("test-2026", False), ("test-2027", True)][::-1]
    assert new_proof["signature"]["key_id"] == "test-2027"
    both = tmp_path / "both.json"
    both.write_text(json.dumps(published))
    keys = public_keys_read([str(both)])
    assert verify(old_proof, keys=keys).ok and verify(new_proof, keys=keys).ok
    # A verifier holding only the old key set does not know the new id, and says so.
    (problem,) = verify(new_proof, keys=public_keys_read([str(exported["keys"])])).problems
    assert problem == "signature: key id 'test-2027' is unknown (the public keys given: test-2026)"
    # A proof whose key id was edited to the other known key: invalid under that key.
    switched = copy_json(old_proof)
    switched["signature"]["key_id"] = "test-2027"
    assert verify(switched, keys=keys).problems[0].startswith("signature: invalid under key test-2027")


def call_command_output(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_a_bare_pem_public_key_verifies_a_proof_whose_key_id_is_its_fingerprint(exported, tmp_path) -> None:
    with override_settings(RETENTION_PROOF_KEY_ID=""):
        pem = tmp_path / "key.pem"
        pem.write_text(call_command_output("cleanup_proof_key", "--pem"))
        proof = proof_sign(proof=sweep_proof(sweep=Sweep.objects.get()))
    keys = public_keys_read([str(pem)])
    assert list(keys) == [proof["signature"]["key_id"]] and proof["signature"]["key_id"].startswith("ed25519-")
    assert verify(proof, keys=keys).ok


def test_without_a_key_debug_signs_with_the_demo_key_and_production_refuses(exported, operator_user) -> None:
    sweep = Sweep.objects.get()
    with override_settings(RETENTION_PROOF_SIGNING_KEY="", DEBUG=True):
        proof = proof_sign(proof=sweep_proof(sweep=sweep))
        published = Client().get("/api/v1/proof-keys/").json()
        assert proof["signature"]["key_id"] == DEMO_KEY_ID
        assert published["keys"][0]["demo"] is True
        assert verify(proof, keys=proof_public_keys()).ok
    # The demo key is the same everywhere: anyone can make it, so it is never used with DEBUG off.
    client = Client()
    client.force_login(operator_user)
    with override_settings(RETENTION_PROOF_SIGNING_KEY="", DEBUG=False):
        for url in (
            f"/console/sweeps/{sweep.pk}/proof.json",
            f"/console/sweeps/{sweep.pk}/proof.csv",
            f"/api/v1/sweeps/{sweep.pk}/proof/",
        ):
            response = client.get(url)
            assert response.status_code == 503, url
            assert b"RETENTION_PROOF_SIGNING_KEY is not set" in response.content
        assert Client().get("/api/v1/proof-keys/").json()["keys"] == []
        ids = {m.id for m in run_checks()}
        assert "cleanup_ops.W120" in ids
        assert "cleanup_ops.E121" in {m.id for m in run_checks(include_deployment_checks=True)}
    with override_settings(RETENTION_PROOF_SIGNING_KEY="/no/such/key.pem"):
        messages = [m for m in run_checks() if m.id == "cleanup_ops.E120"]
        assert [m.msg.split(":")[0] for m in messages] == ["RETENTION_PROOF_SIGNING_KEY"]
