"""Re-take the README walkthrough's screenshots: `.venv/bin/python docs/screenshots/capture.py`.

Starts `manage.py up` on a scratch data folder, follows the walkthrough in Chromium (Playwright,
Debian's /usr/bin/chromium) as operator, reviewer and approver, and writes the PNGs next to this file.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PORT = int(os.environ.get("CAPTURE_PORT", "8790"))
BASE = f"http://127.0.0.1:{PORT}"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def start(data_dir: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_BROKER_URL"))}
    env["STOPDESK_DATA_DIR"] = data_dir
    proc = subprocess.Popen(  # noqa: S603 - our own command line
        [sys.executable, "manage.py", "up", "--port", str(PORT), "--no-demo", "--pace", "6"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    out = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        out += line
        if "Press Ctrl-C" in line:
            break
    admin = re.search(r"Sign in    admin / (\S+)", out)
    cast = re.search(r"Demo cast  .* / (\S+)", out)
    crm = re.search(r"CRM +(\S+?)/? +\(sandbox\)", out)
    assert admin and cast and crm, out
    return proc, {"admin": admin[1], "cast": cast[1], "crm": crm[1], "data": data_dir}


def demo_task(info: dict[str, str], stage: str) -> int:
    env = {**os.environ, "STOPDESK_DATA_DIR": info["data"]}
    out = subprocess.run(  # noqa: S603 - our own command line
        [sys.executable, "manage.py", "demo_task", "--stage", stage, "--pace", "6", "--wait", "60"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"demo task (\d+) started", out)
    assert match, out
    return int(match[1])


def login(page: Page, user: str, password: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{BASE}/login/")
    page.fill("#id_username", user)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_load_state("networkidle")


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(HERE / f"{name}.png"), full_page=True)
    print("wrote", name)


def stop_and_settle(page: Page, task: int, *, confirm_shot: str = "") -> None:
    page.goto(f"{BASE}/tasks/{task}/")
    page.click("text=Stop…")
    if confirm_shot:
        # As a person does it: type the reason at a typing pace, then read it over while the page
        # keeps polling; the open confirmation, its text and its focus stay put.
        page.locator("#stop-reason").press_sequentially("Wrong invoice batch", delay=120)
        page.wait_for_timeout(5000)
        shot(page, confirm_shot)
    page.click("button:has-text('Stop the task')")
    page.wait_for_timeout(500)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "Stopped new work." not in page.inner_text("#summary"):
        page.wait_for_timeout(500)
    # Settled: the page stops polling once nothing is left to reconcile.
    page.wait_for_timeout(8000)
    page.reload()


def propose(page: Page, record_id: str, action_label: str) -> None:
    page.goto(f"{BASE}/queue/")
    row = page.locator("li, tr, article, div.card").filter(has_text=record_id).last
    row.locator("text=Propose…").first.click()
    page.wait_for_timeout(700)
    page.locator("label.choice", has_text=action_label).locator("input").check()
    page.fill("#propose-note", "Created by the agent after the operator stopped the analysis.")
    page.click("button:has-text('Propose')")
    page.wait_for_load_state("networkidle")


def approve(page: Page, record_id: str, password: str) -> None:
    page.goto(f"{BASE}/queue/#proposals")
    page.locator("#proposals li, #proposals article, #proposals .card").filter(has_text=record_id).locator(
        "text=Review…"
    ).first.click()
    page.wait_for_load_state("networkidle")
    page.fill("#approve-password", password)
    page.click("button:has-text('Approve and run')")
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(4000)
    page.reload()


def main() -> None:
    data = tempfile.mkdtemp(prefix="stopdesk-shots-")
    proc, info = start(data)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            cast = info["cast"]

            # 1. A running task, then Stop and the settled summary.
            first = demo_task(info, "email")
            login(page, "operator", cast)
            page.goto(f"{BASE}/tasks/{first}/")
            page.wait_for_timeout(1000)
            shot(page, "1-task-running")
            stop_and_settle(page, first, confirm_shot="8-stop-confirmation-after-polls")
            shot(page, "2-stopped-summary")
            page.locator("#timeline").screenshot(path=str(HERE / "9-stop-timeline.png"))
            print("wrote 9-stop-timeline")

            # 2. The review queue; propose archiving the CRM record; the email can only be reported.
            login(page, "reviewer", cast)
            page.goto(f"{BASE}/queue/")
            shot(page, "3-review-queue")
            propose(page, "msg-1", "Report only")
            shot(page, "4-email-report-only")
            propose(page, "crm-1", "Archive")

            # 3. An approver (not the proposer) approves with their password: the archive runs.
            login(page, "approver", cast)
            approve(page, "crm-1", cast)
            shot(page, "5-compensation-done")

            # 4. A record edited by someone else in the CRM: the approved archive is escalated.
            second = demo_task(info, "record")
            login(page, "operator", cast)
            stop_and_settle(page, second)
            login(page, "reviewer", cast)
            propose(page, "crm-2", "Archive")
            crm = browser.new_page(viewport={"width": 1000, "height": 500})
            crm.goto(info["crm"] + "/")
            crm.locator("tr", has_text="crm-2").locator("button").click()
            crm.wait_for_load_state("networkidle")
            crm.screenshot(path=str(HERE / "6-crm-edited.png"))
            print("wrote 6-crm-edited")
            login(page, "approver", cast)
            approve(page, "crm-2", cast)
            shot(page, "7-stale-version-escalated")
            browser.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


if __name__ == "__main__":
    main()
