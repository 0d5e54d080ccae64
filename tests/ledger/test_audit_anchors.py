"""The audit chain anchored outside the database: each seal signs the heads it moved and appends
them to the anchors directory (and the webhook outbox), so a superuser who rewrites events and
recomputes every hash after them, or cuts a tail, is caught against the anchors; a signed export
is checked with no database at all."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from stopdesk.audit_db import digest
from stopdesk.audit_sign import anchor_valid, anchors_read
from stopdesk.models import Event, EventChain
from stopdesk.notify.models import Notification, WebhookEndpoint
from stopdesk.services.audit import chain_events
from stopdesk.services.audit_seal import audit_seal
from stopdesk.services.events import event_record
from stopdesk.states import ItemState as S
from tests.factories import make_item, make_task

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def _verify(*args: str) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("audit_verify", *args, stdout=out, stderr=out)
    except CommandError as error:
        return False, f"{out.getvalue()}{error}"
    return True, out.getvalue()


def _superuser(statements: list[tuple[str, list]]) -> None:  # type: ignore[type-arg]
    """What a database owner can do: switch the triggers off, rewrite, switch them on again."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE stopdesk_event DISABLE TRIGGER USER")
        for sql, params in statements:
            cursor.execute(sql, params)
        cursor.execute("ALTER TABLE stopdesk_event ENABLE TRIGGER USER")


def _rewrite(task_id: int, seq: int, message: str) -> None:
    """Edit one event and recompute every hash after it, and the head: the chain is whole again."""
    _superuser([("UPDATE stopdesk_event SET message = %s WHERE task_id = %s AND seq = %s", [message, task_id, seq])])
    rows = list(chain_events([task_id]))  # (task, id, hash, seq, *columns)
    prev = next((row[2] for row in rows if int(row[3]) == seq - 1), "")
    updates = []
    for _, event_id, _, at_seq, *columns in rows:
        if int(at_seq) >= seq:
            prev = digest(prev, at_seq, *columns)
            updates.append(("UPDATE stopdesk_event SET hash = %s WHERE id = %s", [prev, event_id]))
    updates.append(("UPDATE stopdesk_eventchain SET hash = %s WHERE task_id = %s", [prev, task_id]))
    _superuser(updates)


def _cut_tail(task_id: int, keep: int) -> None:
    """Delete the events after seq `keep` and move the head back to it: the chain is whole again."""
    last = Event.objects.get(task_id=task_id, seq=keep)
    _superuser(
        [
            ("DELETE FROM stopdesk_event WHERE task_id = %s AND seq > %s", [task_id, keep]),
            ("UPDATE stopdesk_eventchain SET seq = %s, hash = %s WHERE task_id = %s", [keep, last.hash, task_id]),
        ]
    )


def _sealed_task(events: int = 6):  # type: ignore[no-untyped-def]
    task = make_task()
    make_item(task, state=S.COMPLETED)
    for n in range(events):
        event_record(kind="note", actor="test", task=task, message=f"note {n}")
    audit_seal()
    return task


def test_each_seal_signs_the_heads_it_moved_into_the_anchors_directory(audit_anchors):
    task = _sealed_task()
    other = make_task("later")
    audit_seal()
    lines = [json.loads(line) for path in sorted((audit_anchors / "anchors").glob("*.jsonl")) for line in path.open()]
    assert len(lines) == 2
    assert all(anchor_valid(line) for line in lines)
    first, second = ([tuple(h) for h in line["heads"]] for line in lines)
    head = EventChain.objects.get(task_id=task.pk)
    assert (task.pk, head.seq, head.hash) in first
    assert [h[0] for h in second] == [other.pk]  # only the heads that moved
    lines[0]["heads"][0][2] = "0" * 64
    assert not anchor_valid(lines[0])  # a forged head does not verify


@pytest.mark.postgres  # the owner's rewrite switches PostgreSQL's triggers off
def test_a_chain_rewritten_with_every_hash_recomputed_is_caught_against_the_anchors(audit_anchors):
    task = _sealed_task()
    _rewrite(task.pk, seq=3, message="nothing happened")
    ok, report = _verify()
    assert ok, report  # the chain alone is whole again: the gap the anchors close
    ok, report = _verify("--anchors", str(audit_anchors / "anchors"))
    assert not ok
    assert f"task {task.pk}" in report and "the chain was rewritten" in report


@pytest.mark.postgres  # the owner's rewrite switches PostgreSQL's triggers off
def test_a_deleted_tail_is_caught_against_the_anchors(audit_anchors):
    task = _sealed_task()
    head = EventChain.objects.get(task_id=task.pk)
    _cut_tail(task.pk, keep=head.seq - 2)
    ok, report = _verify()
    assert ok, report
    ok, report = _verify("--anchors", str(audit_anchors / "anchors"))
    assert not ok
    assert f"events after seq {head.seq - 2} are missing" in report


def test_a_clean_export_verifies_offline_with_no_database(audit_anchors, tmp_path):
    task = _sealed_task()
    export = tmp_path / "audit.jsonl"
    call_command("audit_export", str(export), stdout=io.StringIO())
    env = {
        **os.environ,
        # Nothing listens there: the check must not need a database.
        "DATABASE_URL": "postgres://nobody@127.0.0.1:9/none",
        "STOPDESK_DATA_DIR": str(tmp_path / "data"),
    }
    args = ["audit_verify", "--export", str(export), "--anchors", str(audit_anchors / "anchors")]
    out = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, timeout=120, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    events = Event.objects.exclude(seq=0).count()
    assert f"{events} events in" in out.stdout and "0 broken" in out.stdout
    chains = EventChain.objects.count()
    assert f"{chains} chains compared with" in out.stdout, out.stdout
    assert EventChain.objects.filter(task_id=task.pk).exists()


@pytest.mark.postgres  # the owner's rewrite switches PostgreSQL's triggers off
def test_an_export_of_a_rewritten_or_cut_chain_fails_against_the_anchors(audit_anchors, tmp_path):
    rewritten, cut = _sealed_task(), _sealed_task()
    _rewrite(rewritten.pk, seq=2, message="nothing happened")
    _cut_tail(cut.pk, keep=3)
    export = tmp_path / "audit.jsonl"
    call_command("audit_export", str(export), stdout=io.StringIO())
    ok, report = _verify("--export", str(export))
    assert ok, report  # signed and whole: only the anchors tell
    ok, report = _verify("--export", str(export), "--anchors", str(audit_anchors / "anchors"))
    assert not ok
    assert f"task {rewritten.pk}" in report and "the chain was rewritten" in report
    assert f"task {cut.pk}" in report and "events after seq 3 are missing" in report


def test_an_export_changed_after_signing_or_signed_by_another_key_is_refused(audit_anchors, tmp_path, settings):
    _sealed_task()
    export = tmp_path / "audit.jsonl"
    call_command("audit_export", str(export), stdout=io.StringIO())
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(export.read_bytes().replace(b"note 1", b"note 7"))
    ok, report = _verify("--export", str(edited))
    assert not ok and "the signature does not verify" in report
    settings.STOPDESK_AUDIT = {**settings.STOPDESK_AUDIT, "DEV_KEY_FILE": str(tmp_path / "another-key.pem")}
    forged = tmp_path / "forged.jsonl"
    call_command("audit_export", str(forged), stdout=io.StringIO())
    ok, report = _verify("--export", str(forged), "--anchors", str(audit_anchors / "anchors"))
    assert not ok and "which signed none of the anchors" in report
    ok, report = _verify("--export", str(forged), "--public-key", str(audit_anchors / "signing-key.pem"))
    assert not ok and "not by the trusted key" in report


def test_a_seal_whose_anchor_cannot_be_written_does_not_happen(audit_anchors, settings):
    task = make_task()
    (audit_anchors / "not-a-directory").write_text("")
    settings.STOPDESK_AUDIT = {**settings.STOPDESK_AUDIT, "ANCHORS_DIR": str(audit_anchors / "not-a-directory")}
    with pytest.raises(OSError):
        audit_seal()
    assert set(Event.objects.filter(task=task).values_list("seq", "hash")) == {(0, "")}
    assert not EventChain.objects.filter(task_id=task.pk).exists()


def test_the_webhook_outbox_gets_the_signed_heads_when_an_endpoint_names_the_topic():
    make_task()
    audit_seal()
    assert not Notification.objects.filter(topic="audit_anchor").exists()  # nobody asked
    WebhookEndpoint.objects.create(name="anchors", url="http://127.0.0.1:9/anchors", topics=["audit_anchor"])
    task = make_task("watched")
    audit_seal()
    note = Notification.objects.get(topic="audit_anchor")
    assert anchor_valid(note.data["anchor"])
    head = EventChain.objects.get(task_id=task.pk)
    assert note.data["anchor"]["heads"] == [[task.pk, head.seq, head.hash]]


def test_audit_keygen_writes_a_key_once_and_the_sealer_signs_with_it(tmp_path, settings, audit_anchors):
    key = tmp_path / "audit.pem"
    out = io.StringIO()
    call_command("audit_keygen", str(key), stdout=out)
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    key_id = out.getvalue().split("(")[1].split(")")[0]
    with pytest.raises(CommandError, match="never overwritten"):
        call_command("audit_keygen", str(key), stdout=io.StringIO())
    settings.STOPDESK_AUDIT = {**settings.STOPDESK_AUDIT, "SIGNING_KEY_FILE": str(key)}
    make_task()
    audit_seal()
    assert anchors_read(audit_anchors / "anchors").key_ids == {key_id}
    assert not (audit_anchors / "signing-key.pem").exists()  # no key generated beside the data
