"""Drives Spindle's web pages in headless Chromium against a live `spindle
serve` (with the real model and an API key), the way a person would.

Run by tests/webui.rs, which starts the server and passes:
  SPINDLE_ROOT         the server's root URL (http://127.0.0.1:PORT)
  SPINDLE_KEY          its API key
  SPINDLE_MODEL        the served model's name
  SPINDLE_SCREENSHOTS  a directory for the screenshots (created)
  CHROMIUM, CHROMEDRIVER  the browser and its driver (Debian's chromium
                       and chromium-driver)
Each check prints its name; any failure raises (a screenshot of the page
then goes to the screenshot directory as failure-*.png).
"""

import json
import os
import sys
import threading
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

ROOT = os.environ["SPINDLE_ROOT"].rstrip("/")
KEY = os.environ["SPINDLE_KEY"]
MODEL = os.environ["SPINDLE_MODEL"]
SHOTS = os.environ["SPINDLE_SCREENSHOTS"]
os.makedirs(SHOTS, exist_ok=True)

DESKTOP = (1280, 860)
PHONE = (390, 844)


def api(path, body=None):
    """A request to the server with the key, as the tests' own client."""
    req = urllib.request.Request(ROOT + path, method="POST" if body is not None else "GET")
    req.add_header("Authorization", "Bearer " + KEY)
    data = None
    if body is not None:
        req.add_header("Content-Type", "application/json")
        data = json.dumps(body).encode()
    with urllib.request.urlopen(req, data, timeout=120) as r:
        raw = r.read().decode()
    return json.loads(raw) if path != "/metrics" else raw


def metric(name):
    total = 0.0
    for line in api("/metrics").splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-quic", "--no-first-run", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--disable-extensions",
              "--hide-scrollbars", "--force-device-scale-factor=1"]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(service=service, options=opts)
    d.set_window_size(*DESKTOP)
    d.set_page_load_timeout(30)
    d.set_script_timeout(30)
    return d


d = browser()
wait = lambda seconds=30: WebDriverWait(d, seconds, poll_frequency=0.1)
by_id = lambda i: d.find_element(By.ID, i)


def shot(name):
    path = os.path.join(SHOTS, name + ".png")
    d.save_screenshot(path)
    return path


def check(name):
    def wrap(f):
        t = time.time()
        try:
            f()
        except BaseException:
            try:
                shot("failure-" + f.__name__)
            except BaseException:
                pass
            raise
        print(f"ok {name} ({time.time() - t:.1f} s)", flush=True)
        return f
    return wrap


def stored():
    return d.execute_script("return JSON.parse(localStorage.getItem('spindle.chat.v1'))")


def current_conversation():
    s = stored()
    return next(c for c in s["conversations"] if c["id"] == s["current"])


def set_field(element_id, value):
    """Types into a settings field with the keyboard (select all, then type)."""
    e = by_id(element_id)
    e.send_keys(Keys.CONTROL, "a")
    e.send_keys(Keys.DELETE)
    if value:
        e.send_keys(value)


def open_settings():
    if by_id("settings").get_attribute("hidden") is not None:
        by_id("toggle-settings").click()


def send_message(text):
    box = by_id("composer-input")
    box.click()
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def wait_reply_done(seconds=120):
    wait(seconds).until(lambda _: by_id("send").is_displayed() and not by_id("stop").is_displayed())


def resources_on_origin():
    names = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    off = [n for n in names if not n.startswith(ROOT + "/")]
    assert not off, f"requests off the server's origin: {off}"
    return len(names)


@check("the chat page loads from the binary, asks for the API key, and lists the model")
def _():
    d.get(ROOT + "/")
    wait().until(lambda _: d.execute_script("return document.getElementById('key-dialog').open"))
    key = by_id("key-input")
    key.send_keys("wrong-key")
    key.send_keys(Keys.ENTER)
    # The wrong key is refused and the dialog asks again, saying so.
    wait().until(lambda _: d.execute_script("return document.getElementById('key-dialog').open")
                 and by_id("key-error").is_displayed())
    assert "refused" in by_id("key-error").text, by_id("key-error").text
    key = by_id("key-input")
    key.send_keys(KEY)
    key.send_keys(Keys.ENTER)
    wait().until(lambda _: by_id("model-name").text == MODEL)
    assert d.execute_script("return localStorage.getItem('spindle.apiKey')") == KEY


@check("keyboard only: the message box is reachable with Tab, Enter sends, the reply streams and equals the API's")
def _():
    open_settings()
    set_field("set-temperature", "0")
    set_field("set-max-tokens", "40")
    set_field("set-seed", "3")
    by_id("close-settings").click()
    # From the top of the page, Tab reaches the message box.
    d.find_element(By.TAG_NAME, "body").click()
    for _ in range(40):
        if d.switch_to.active_element.get_attribute("id") == "composer-input":
            break
        d.switch_to.active_element.send_keys(Keys.TAB)
    assert d.switch_to.active_element.get_attribute("id") == "composer-input", "Tab never reached the message box"
    prompt = "List three uses of a paperclip."
    d.switch_to.active_element.send_keys(prompt)
    d.switch_to.active_element.send_keys(Keys.ENTER)
    # Streaming: the stop button shows while text arrives.
    wait().until(lambda _: by_id("stop").is_displayed())
    wait_reply_done()
    conv = current_conversation()
    reply = conv["messages"][-1]
    assert reply["role"] == "assistant" and reply["content"], reply
    assert conv["title"].startswith("List three uses"), conv["title"]
    stats = d.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")[-1].text
    assert "tok/s" in stats and "tokens/pass" in stats and "tokens" in stats, stats
    # The same request through the API, unstreamed: the same text.
    want = api("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                                         "max_tokens": 40, "temperature": 0, "top_p": 0.95, "seed": 3})
    assert reply["content"] == want["choices"][0]["message"]["content"], (reply["content"], want)
    assert reply["stats"]["completion_tokens"] == want["usage"]["completion_tokens"]


@check("text mode (for base models) continues the text as /v1/completions does, Markdown rendered")
def _():
    by_id("new-chat").click()
    open_settings()
    by_id("set-complete").click()
    set_field("set-temperature", "0")
    set_field("set-max-tokens", "60")
    by_id("close-settings").click()
    prompt = "# Making tea\n\nA short guide, with a list of steps:\n\n1."
    box = by_id("composer-input")
    box.click()
    for i, line in enumerate(prompt.split("\n")):
        if i:
            box.send_keys(Keys.SHIFT, Keys.ENTER)
        box.send_keys(line)
    box.send_keys(Keys.ENTER)
    wait_reply_done()
    reply = current_conversation()["messages"][-1]
    want = api("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 60, "temperature": 0,
                                    "top_p": 0.95})
    assert reply["content"] == want["choices"][0]["text"], (reply["content"], want)
    shot("chat-desktop")


@check("Stop ends a long reply, keeps its text, and the server cancels the request")
def _():
    cancelled = metric("spindle:request_cancelled_total")
    open_settings()
    set_field("set-max-tokens", "1500")
    set_field("set-temperature", "0.8")
    by_id("close-settings").click()
    send_message("Write a very long story about a lighthouse keeper and the sea.")
    wait().until(lambda _: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
                 and len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant .body")[-1].text) > 40)
    by_id("stop").click()
    wait_reply_done(10)
    reply = current_conversation()["messages"][-1]
    assert reply.get("stopped") is True and len(reply["content"]) > 40, reply
    assert "stopped" in d.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")[-1].text
    deadline = time.time() + 20
    while time.time() < deadline:
        if metric("spindle:num_requests_running") == 0 and metric("spindle:request_cancelled_total") > cancelled:
            break
        time.sleep(0.2)
    assert metric("spindle:num_requests_running") == 0, "the stopped request still runs"
    assert metric("spindle:request_cancelled_total") > cancelled, "the server did not count a cancel"
    open_settings()
    set_field("set-max-tokens", "40")
    set_field("set-temperature", "0")
    by_id("close-settings").click()


@check("conversations survive a reload; new, rename and delete work")
def _():
    before = current_conversation()
    d.refresh()
    wait().until(lambda _: by_id("model-name").text == MODEL)
    titles = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .open")]
    assert before["title"] in titles, titles
    assert len(d.find_elements(By.CSS_SELECTOR, "#messages .msg")) == len(before["messages"])
    count = len(stored()["conversations"])
    by_id("new-chat").click()
    assert len(d.find_elements(By.CSS_SELECTOR, "#conversations .conversation")) == count + 1
    assert d.find_elements(By.CSS_SELECTOR, "#messages .msg") == []
    # Rename the new one with the keyboard.
    d.find_element(By.CSS_SELECTOR, "#conversations .active .rename").click()
    box = d.find_element(By.CSS_SELECTOR, "#conversations .rename-input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("Scratch")
    box.send_keys(Keys.ENTER)
    assert "Scratch" in [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .open")]
    # Delete takes two presses.
    delete = d.find_element(By.CSS_SELECTOR, "#conversations .active .delete")
    delete.click()
    assert len(stored()["conversations"]) == count + 1
    d.find_element(By.CSS_SELECTOR, "#conversations .active .delete").click()
    assert "Scratch" not in [c["title"] for c in stored()["conversations"]]
    assert len(stored()["conversations"]) == count
    # The old conversation opens again, whole.
    d.find_element(By.CSS_SELECTOR, f'#conversations [data-id="{before["id"]}"] .open').click()
    assert len(d.find_elements(By.CSS_SELECTOR, "#messages .msg")) == len(before["messages"])


@check("model output holding <script> and <img onerror> renders as text")
def _():
    by_id("new-chat").click()
    payload = "<script>window.__pwned=1</script><img src=x onerror=window.__pwned=2><b>bold</b>"
    schema = {"type": "object", "properties": {"x": {"const": payload}}, "required": ["x"]}
    open_settings()
    set_field("set-schema", json.dumps(schema))
    by_id("close-settings").click()
    send_message("Reply with the object.")
    wait_reply_done()
    reply = current_conversation()["messages"][-1]
    assert payload in reply["content"], reply
    body = d.find_elements(By.CSS_SELECTOR, ".msg.assistant .body")[-1]
    assert "<script>window.__pwned=1</script>" in body.text and "<img src=x" in body.text, body.text
    inside = d.execute_script("return arguments[0].querySelectorAll('script, img, b, iframe, [onerror]').length", body)
    assert inside == 0, f"{inside} elements made from model output"
    time.sleep(0.5)
    assert d.execute_script("return window.__pwned === undefined"), "model output ran"
    shot("chat-script-as-text")


@check("the decision playground shows the probabilities /v1/decide gives")
def _():
    by_id("tab-decide").click()
    assert by_id("decide-view").is_displayed() and not by_id("chat-view").is_displayed()
    by_id("decide-ask").click()
    wait(60).until(lambda _: d.find_elements(By.CSS_SELECTOR, "#decide-result .bar-row"))
    rows = d.find_elements(By.CSS_SELECTOR, "#decide-result .bar-row")
    shown = {r.get_attribute("data-option"): float(r.get_attribute("data-probability")) for r in rows}
    want = api("/v1/decide", {
        "model": MODEL,
        "state": by_id("decide-state").get_attribute("value"),
        "questions": [{"id": "answer", "kind": "choice", "question": by_id("decide-question").get_attribute("value"),
                       "options": ["rollback", "page_team", "wait"]}],
    })["questions"][0]
    assert set(shown) == {"rollback", "page_team", "wait"}, shown
    for k, p in want["probabilities"].items():
        assert abs(shown[k] - p) < 1e-9, (k, shown[k], p)
    assert abs(sum(shown.values()) - 1) < 1e-6
    assert "Selected: " + want["selected"] in by_id("decide-result").text
    shot("decide-desktop")
    by_id("tab-chat").click()


@check("at phone width the conversations open from the menu and the page fits")
def _():
    d.set_window_size(*PHONE)
    d.refresh()
    wait().until(lambda _: by_id("model-name").get_attribute("textContent") == MODEL)
    width = d.execute_script("return document.documentElement.scrollWidth")
    assert width <= PHONE[0], f"the page is {width} px wide at {PHONE[0]}"
    sidebar_left = lambda: d.execute_script("return document.getElementById('sidebar').getBoundingClientRect().right")
    assert sidebar_left() <= 0, "the sidebar covers the chat at phone width"
    by_id("toggle-sidebar").click()
    wait(5).until(lambda _: sidebar_left() > 100)
    shot("chat-phone-conversations")
    tea = next(e for e in d.find_elements(By.CSS_SELECTOR, "#conversations .open")
               if e.get_attribute("textContent").startswith("# Making tea"))
    tea.click()
    wait(5).until(lambda _: sidebar_left() <= 0)
    assert by_id("composer-input").is_displayed() and by_id("send").is_displayed()
    shot("chat-phone")
    d.set_window_size(*DESKTOP)


@check("no request from the chat page leaves the origin; the page cannot reach another host")
def _():
    n = resources_on_origin()
    assert n >= 5, n
    # The Content-Security-Policy stops a script of the page from calling
    # out (what a script injected through model output would try first).
    result = d.execute_async_script(
        "const done = arguments[0];"
        "fetch('https://example.com/x').then(() => done('reached'), e => done('refused: ' + e));")
    assert result.startswith("refused"), result


PREAMBLE = ("You are the assistant of a small hardware shop. Answer in one short sentence, "
            "politely, and never invent prices or opening hours that you were not told. ") * 2


def load(seconds, clients=3):
    """`clients` threads sending completions (after a shared preamble, which
    the prefix cache then holds) and one asking decisions, for `seconds`."""
    stop = time.time() + seconds
    errors = []

    def one(i):
        while time.time() < stop:
            try:
                api("/v1/completions", {"model": MODEL, "prompt": PREAMBLE + f"Count slowly: {i}, {i + 1}, {i + 2},",
                                        "max_tokens": 48, "temperature": 0.7})
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    def decisions():
        while time.time() < stop:
            try:
                api("/v1/decide", {"model": MODEL, "state": PREAMBLE + "A customer asks for a refund.",
                                   "questions": [{"id": "refund", "kind": "yes_no"}]})
                time.sleep(0.5)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    threads.append(threading.Thread(target=decisions))
    for t in threads:
        t.start()
    return threads, errors


@check("the dashboard draws /metrics live, and its charts move under load")
def _():
    d.get(ROOT + "/dashboard")
    wait().until(lambda _: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-ticks") or 0) >= 2)
    latest = lambda cid: json.loads(by_id(cid).get_attribute("data-latest"))
    points = lambda: d.find_element(By.CSS_SELECTOR, "#chart-tokens polyline").get_attribute("points")
    quiet = points()
    # Longer for the documentation's screenshots (a fuller chart).
    seconds = float(os.environ.get("SPINDLE_DASHBOARD_LOAD_SECONDS", "12"))
    loaded_until = time.time() + seconds
    threads, errors = load(seconds)
    saw_running = saw_tokens = False
    saw_decisions = saw_hits = False
    while any(t.is_alive() for t in threads):
        saw_running |= (latest("chart-requests")[0] or 0) > 0
        saw_tokens |= (latest("chart-tokens")[0] or 0) > 0
        saw_decisions |= (latest("chart-decisions")[0] or 0) > 0
        saw_hits |= (latest("chart-prefix")[0] or 0) > 0
        if (saw_running and saw_tokens) and time.time() > loaded_until - 2:
            break
        time.sleep(0.25)
    shot("dashboard-desktop")
    d.set_window_size(*PHONE)
    time.sleep(1.2)
    shot("dashboard-phone")
    d.set_window_size(*DESKTOP)
    for t in threads:
        t.join()
    assert not errors, errors
    assert saw_running, "the requests chart never showed a running request"
    assert saw_tokens, "the tokens-per-second chart never rose"
    assert saw_decisions, "the decisions chart never rose"
    assert saw_hits, "the prefix-cache chart never showed a hit"
    assert points() != quiet, "the chart's line did not change"
    # The table shows /metrics' own numbers: generated tokens as counted
    # there (read after the table, so at least the table's value).
    time.sleep(1.5)
    # (Read in one script: the table is redrawn every second.)
    shown = float(d.execute_script(
        "return document.querySelector('[data-metric=\"spindle:generation_tokens_total\"]').textContent"))
    now = metric("spindle:generation_tokens_total")
    assert 0 < shown <= now, (shown, now)
    assert now - shown < 200, (shown, now)
    bars = d.execute_script("return document.querySelectorAll('#by-position .bar-row').length")
    assert bars == 16, bars
    resources_on_origin()


logs = d.get_log("browser")
errors = [entry for entry in logs if entry["level"] == "SEVERE"
          and "example.com" not in entry["message"] and "favicon" not in entry["message"]
          and "401" not in entry["message"]]
d.quit()
assert not errors, f"the browser's console had errors: {errors}"
print("all web page checks passed")
sys.exit(0)
