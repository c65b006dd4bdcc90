"""durun ui in a real browser: headless Chromium (Debian's package) driven
by Playwright. Fails on any request to another host, any dialog, any
console error (a blocked inline script or style shows there), and on each
check below.

usage: ui_browser.py URL   (the URL durun ui printed, with its token)

Environment: CHROMIUM (the browser), DURUN_BIN and DURUN_JOURNAL (to start
a run while the page is open), UI_AGENT (tests/agents/ui_agent.py),
DURUN_UI_SCREENSHOTS (a directory: write list.png and task.png there).
"""
import os
import subprocess
import sys
import time
from urllib.parse import urlsplit

from playwright.sync_api import expect, sync_playwright

url = sys.argv[1]
origin = "{0.scheme}://{0.netloc}".format(urlsplit(url))
shots = os.environ.get("DURUN_UI_SCREENSHOTS")
problems = []


def check(what, ok):
    if not ok:
        problems.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


with sync_playwright() as playwright:
    browser = playwright.chromium.launch(
        executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
        args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    )
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.on("request", lambda request: check(f"a request to another host: {request.url}",
                                             request.url.startswith(origin + "/")))
    page.on("dialog", lambda dialog: (check(f"a dialog: {dialog.message}", False), dialog.dismiss()))
    page.on("console", lambda message: check(f"console {message.type}: {message.text}", message.type != "error"))

    # The list, reached through the printed URL: the token became a cookie.
    page.goto(url)
    check("the token left the address bar", "token=" not in page.url)
    expect(page.locator("table.tasks")).to_contain_text("javascript:alert.1")
    expect(page.locator("table.tasks")).to_contain_text("release-1.4")
    if shots:
        page.screenshot(path=os.path.join(shots, "list.png"))

    # Journal data with markup is text on the page.
    page.locator("a", has_text="javascript:alert.1").click()
    expect(page.locator("h1")).to_contain_text("javascript:alert.1")
    expect(page.locator("table.steps")).to_contain_text("<script>alert(1)</script><img src=x onerror=alert(2)>")
    expect(page.locator("table.steps")).to_contain_text("\\x1b[31mred")
    check("no element made from the data", page.locator("main img, main script, main a[href^='javascript']").count() == 0)
    page.click("table.steps a[href$='/steps/4']")
    expect(page.locator("main")).to_contain_text("refused: <script>alert(1)</script>")
    page.go_back()

    # Approve through the button: the signal is in the journal, the page
    # shows it without a reload.
    page.evaluate("window.__kept = 'same page'")
    page.fill("form[action$='/approve'] input[name=comment]", "looks good")
    page.click("form[action$='/approve'] button")
    expect(page.locator("#said")).to_contain_text("approved task javascript:alert.1")
    expect(page.locator("main")).to_contain_text("Signals")
    expect(page.locator("main")).to_contain_text("looks good")
    check("approving did not reload the page", page.evaluate("window.__kept") == "same page")

    # A run started while the list is open shows up, and its page follows
    # its steps to the end, without a reload.
    page.goto(origin + "/")
    page.evaluate("window.__kept = 'same page'")
    env = dict(os.environ, UI_PLAIN="1", UI_STEPS="6", UI_SLEEP="0.4")
    run = subprocess.Popen([os.environ["DURUN_BIN"], "-q", "run", "--task", "live-run", "--",
                            sys.executable, os.environ["UI_AGENT"]], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    expect(page.locator("table.tasks")).to_contain_text("live-run", timeout=10_000)
    check("the list updated without a reload", page.evaluate("window.__kept") == "same page")
    page.locator("a", has_text="live-run").click()
    expect(page.locator("h1 .badge")).to_have_text("running", timeout=10_000)
    page.evaluate("window.__kept = 'same page'")
    started = time.monotonic()
    seen = page.locator("table.steps tbody tr").count()
    expect(page.locator("table.steps tbody tr")).not_to_have_count(seen, timeout=5_000)
    expect(page.locator("h1 .badge")).to_have_text("completed", timeout=20_000)
    expect(page.locator("table.steps tbody tr")).to_have_count(7)
    check("the task page updated without a reload", page.evaluate("window.__kept") == "same page")
    check("the run ended well", run.wait(timeout=30) == 0)

    # A model call reads as a conversation with roles, a stream as the text
    # it carried; the request and answer as recorded are one click away.
    page.goto(origin + "/tasks/chat-call/steps/1")
    expect(page.locator(".chat .msg.system")).to_contain_text("Be brief.")
    expect(page.locator(".chat .msg.user")).to_contain_text("hello model")
    expect(page.locator(".chat .msg.assistant")).to_contain_text("echo: hello model")
    raw = page.locator("details.raw")
    check("the raw request is folded", not raw.evaluate("element => element.open"))
    raw.locator(":scope > summary").click()
    expect(raw).to_contain_text("choices")
    page.goto(origin + "/tasks/chat-call/steps/2")
    expect(page.locator(".chat .msg.user")).to_contain_text("stream to me")
    expect(page.locator(".chat .msg.assistant")).to_have_count(1)
    expect(page.locator(".chat .msg.assistant")).to_contain_text("echo: stream to me")
    check("the stream's events are not shown as text", "content_block_delta" not in page.locator("main").inner_text())
    if shots:
        page.screenshot(path=os.path.join(shots, "model-call.png"), full_page=True)

    # The task page of a task that was resumed, for the README.
    page.goto(origin + "/tasks/release-1.4")
    expect(page.locator("svg.timeline rect.replayed").first).to_be_visible()
    if shots:
        page.screenshot(path=os.path.join(shots, "task.png"), full_page=True)
        page.goto(origin + "/tokens")
        page.screenshot(path=os.path.join(shots, "tokens.png"))
    browser.close()

if problems:
    sys.exit("\n".join(problems))
print("ok")
