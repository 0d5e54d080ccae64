"""The dashboard in real Chromium: sign in, Stop a running task and watch it settle, resolve an
uncertain item, propose and approve a compensation, and see the escalation when the record was
edited in between. Screenshots of the main pages go to test-artifacts/screenshots/."""

from __future__ import annotations

import threading

import pytest

from reconcile.models import Compensation
from stopdesk.models import WorkItem
from stopdesk.states import ItemState
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect, proposal, running_task, settle, uncertain_item

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
S = ItemState


def _login(page, base: str, name: str) -> None:  # type: ignore[no-untyped-def]
    page.context.clear_cookies()
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(f"{name}-pass-123")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/tasks/")


@pytest.fixture
def world(roles, crm, eager):  # type: ignore[no-untyped-def]
    from stopdesk.celery import app

    app.loader.import_default_modules()  # the cancel job Stop dispatches runs eagerly here
    task = running_task("Draft the Q3 supplier emails")
    crm_url = system_url("crm")
    record = crm_effect(crm_url, name="ACME Ltd")
    other = crm_effect(crm_url, name="Globex GmbH")
    item = uncertain_item(label="Upload price list to the partner portal")
    return {"task": task, "record": record, "other": other, "item": item, "crm": crm, "cast": roles}


def test_the_review_dashboard_end_to_end(live_server, browser, shots, world):
    base = live_server.url
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    # An operator signs in and opens the running task.
    _login(page, base, "operator")
    page.screenshot(path=shots / "01-task-list.png", full_page=True)
    page.get_by_role("link", name="Draft the Q3 supplier emails").click()
    summary = page.locator("#summary")
    assert "Running: one of four items finished." in summary.inner_text()
    page.screenshot(path=shots / "02-task-running.png", full_page=True)
    page.evaluate("window.__noReload = true")

    # Stop: a confirmation step, then the htmx POST.
    page.get_by_role("link", name="Stop…").click()
    page.get_by_role("heading", name="Stop this task?").wait_for()
    page.get_by_label("Reason").fill("Wrong supplier list")
    page.screenshot(path=shots / "03-stop-confirm.png", full_page=True)
    page.get_by_role("button", name="Stop the task").click()
    page.locator("#stop-state", has_text="Stopping…").wait_for()
    # A poll that left before the stop committed may land just after it; the next one is current.
    page.locator("#summary", has_text="Stopped new work.").wait_for()
    assert "still being checked" in summary.inner_text()
    page.screenshot(path=shots / "04-stopping.png", full_page=True)

    # The cancel of the running export is read back (here: by the reconciler, a moment later).
    export = WorkItem.objects.get(task=world["task"], noun="export")
    timer = threading.Timer(1.0, settle, args=[export.pk, S.CANCELLED])
    timer.start()
    page.locator("#summary.stopped").wait_for(timeout=15000)  # settled: the poller got 286
    timer.join()
    settled = summary.inner_text()
    assert (
        settled
        == "Stopped new work. Two drafts discarded. One export stopped before it finished. One summary completed."
    )
    assert page.evaluate("window.__noReload") is True  # updated in place, no reload
    page.locator("#stop-state", has_text="Stopped").wait_for()
    page.screenshot(path=shots / "05-task-stopped.png", full_page=True)

    # A reviewer resolves the uncertain item with evidence.
    _login(page, base, "reviewer")
    page.get_by_role("link", name="Review queue").click()
    page.screenshot(path=shots / "06-review-queue.png", full_page=True)
    row = page.locator(f"#uncertain-{world['item'].pk}")
    row.get_by_role("link", name=f"Resolve item {world['item'].pk}").click()
    panel = page.locator(f"#panel-{world['item'].pk}")  # the form opens beside its row
    panel.get_by_role("radio", name="Completed").check()
    panel.get_by_label("Note").fill("The upload landed before Stop")
    panel.get_by_label("Evidence").fill("Portal shows price-list-q3.csv, uploaded 10:02")
    page.screenshot(path=shots / "07-resolve.png", full_page=True)
    panel.get_by_role("button", name="Resolve").click()
    page.get_by_text("Resolved upload").wait_for()
    assert WorkItem.objects.get(pk=world["item"].pk).state == S.COMPLETED

    # ... and proposes archiving the CRM record created after Stop.
    page.locator(f"#record-{world['record'].pk}").get_by_role("link", name="Propose…").click()
    page.get_by_role("radio", name="Archive the record").check()
    page.get_by_label("Note for the approver").fill("Created by the stopped run; the customer never asked.")
    page.get_by_role("button", name="Propose").click()
    page.get_by_text("Another person with the approver role must approve it.").first.wait_for()
    compensation = Compensation.objects.get(external_record=world["record"])
    # The second record gets a proposal too; someone will edit it in the CRM before approval.
    stale = proposal(world["other"], world["cast"]["reviewer"])

    # An approver re-enters the password and approves: it runs and archives the record.
    _login(page, base, "approver")
    page.goto(f"{base}/compensations/{compensation.pk}/")
    page.screenshot(path=shots / "08-approve.png", full_page=True)
    page.get_by_label("Your password").fill("approver-pass-123")
    page.get_by_role("button", name="Approve and run").click()
    page.locator("#compensation-status", has_text="Done").wait_for()
    assert world["crm"].get(world["record"].record_id)["status"] == "archived"
    page.screenshot(path=shots / "09-compensation-done.png", full_page=True)

    # Someone edits the other record in the CRM; approving its compensation now escalates.
    world["crm"].edit(world["other"].record_id, actor="a colleague", phone="555-0100")
    page.goto(f"{base}/compensations/{stale.pk}/")
    page.get_by_role("button", name="Approve and run").click()  # password entered a moment ago
    page.locator("#stale").wait_for()
    text = page.locator("#stale").inner_text()
    assert "approved against version 1, the record is now at version 2" in text and "Nothing was written" in text
    assert world["crm"].get(world["other"].record_id)["status"] == "active"
    page.screenshot(path=shots / "10-escalated-stale-version.png", full_page=True)
    page.goto(f"{base}/queue/")
    page.locator(f"#compensation-{stale.pk}").wait_for()
    page.screenshot(path=shots / "11-queue-escalation.png", full_page=True)

    # The same pages on a phone.
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    mobile = phone.new_page()
    _login(mobile, base, "reviewer")
    mobile.goto(f"{base}/tasks/{world['task'].pk}/")
    mobile.screenshot(path=shots / "12-phone-task.png", full_page=True)
    mobile.goto(f"{base}/queue/")
    mobile.screenshot(path=shots / "13-phone-queue.png", full_page=True)
    phone.close()
    context.close()
    assert not [e for e in errors if "Content Security Policy" in e], errors


def test_stop_works_by_keyboard_alone(live_server, browser, shots, world):
    base = live_server.url
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    _login(page, base, "operator")
    page.goto(f"{base}/tasks/{world['task'].pk}/")
    page.get_by_role("link", name="Stop…").focus()
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Stop this task?").wait_for()
    # The confirmation takes focus, so the next keys act on it.
    assert page.evaluate("document.activeElement.id") == "stop-reason"
    page.keyboard.type("keyboard only")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.locator("#stop-state", has_text="Stopping…").wait_for()
    context.close()
