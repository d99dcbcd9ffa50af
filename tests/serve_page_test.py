#!/usr/bin/env python3
"""Loads the web view of a running `dedup serve` in headless Chromium (Debian's
/usr/bin/chromium) and checks the page as the browser rendered it, driving the
browser over the DevTools protocol on a pipe (--remote-debugging-pipe): standard
library only, no driver download.

  serve_page_test.py BASE_URL TOKEN PASSWORD [SCREENSHOT.png]

Before it runs, the server's store must hold the records serve_page_test.sh
claims. Exits 0 when every check passed.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

BASE, TOKEN, PASSWORD = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
SHOT = sys.argv[4] if len(sys.argv) > 4 else None
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
failures = 0


def check(what, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + "page: " + what + ("" if ok else "  " + str(detail)))
    if not ok:
        failures += 1


class Browser:
    """One headless Chromium; commands go in on fd 3, answers come out on fd 4,
    each a JSON message ended by a NUL byte."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="serve-page-chromium.")
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        # The child sees the pipes as fds 3 and 4.
        def setup():
            # Via fresh numbers first: a pipe end may itself be fd 3 or 4, and
            # dup2 onto itself would leave it close-on-exec.
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)
        args = [CHROMIUM, "--headless", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--mute-audio",
                "--user-data-dir=" + self.profile, "--window-size=1280,900"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root with it
        # close_fds=False: the fds made in setup() must survive (Python's own pipe
        # fds are not inheritable, so nothing else leaks into the browser).
        self.proc = subprocess.Popen(args, preexec_fn=setup, close_fds=False,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.next_id = 0
        self.buf = b""
        self.events = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=True)
        self.send("Runtime.enable", session=True)

    def read_message(self, timeout=30):
        deadline = time.time() + timeout
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.from_child, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=False):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        while True:
            m = self.read_message()
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(method + ": " + json.dumps(m["error"]))
                return m.get("result", {})
            self.events.append(m)

    def eval(self, expr):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True}, session=True)
        if "exceptionDetails" in r:
            raise RuntimeError("page threw: " + json.dumps(r["exceptionDetails"])[:500])
        return r["result"].get("value")

    def wait_for(self, expr, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.1)
        return None

    def goto(self, url):
        self.send("Page.navigate", {"url": url}, session=True)

    def close(self):
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def api(method, path):
    req = urllib.request.Request(BASE + path, method=method,
                                 headers={"Authorization": "Bearer " + TOKEN})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


b = Browser()
try:
    # Without the token the page is refused.
    b.goto(BASE + "/")
    b.wait_for("document.readyState === 'complete'")
    check("without the token the page answers 401",
          "Unauthorized" in (b.eval("document.body.innerText") or ""))

    # Opened once with ?token=, the token moves into a cookie and the URL loses it.
    b.goto(BASE + "/?token=" + TOKEN)
    ready = b.wait_for("document.body && document.body.dataset.ready === '1'")
    check("the page loads and finishes its first fetches", ready is True)
    check("the token is gone from the address", "token" not in b.eval("location.href"))
    check("no fetch failed", b.eval("document.getElementById('error').hidden") is True,
          b.eval("document.getElementById('error').textContent"))

    keys = b.eval("[...document.querySelectorAll('#records td.key')].map(e => e.textContent)")
    check("records are listed with their keys",
          "web-completed" in keys and "web-stuck" in keys and "web-forget-me" in keys, keys)
    evil = "web-<script>window.pwned=1</script>"
    evil_img = 'web-<img src=x onerror="window.pwned=2">'
    check("a key of <script>…</script> shows as text", evil in keys, keys)
    check("a key of <img onerror> shows as text", evil_img in keys, keys)
    check("neither ran or became an element",
          b.eval("window.pwned === undefined && "
                 "document.querySelectorAll('main script, main img').length === 0"))

    row = b.eval("""(() => {
      const tr = [...document.querySelectorAll('#records tbody tr')]
        .find(r => r.querySelector('td.key').textContent === 'web-completed');
      return [...tr.children].map(td => td.textContent);
    })()""")
    check("a completed record shows state, fence, attempt, retention, status",
          row[1] == "completed" and row[3] == "1" and row[4] == "1" and row[5].endswith(" h")
          and row[6] == "ok", row)
    stuck = b.eval("[...document.querySelectorAll('#stuck td.key')].map(e => e.textContent)")
    check("the in-progress record whose lease ran out is listed as such",
          stuck == ["web-stuck"], stuck)
    check("... saying its lease ran out", "ran out" in b.eval(
        "document.querySelector('#stuck tbody tr td:nth-child(2)').textContent"))
    counters = b.eval("Object.fromEntries([...document.querySelectorAll('.counter')]"
                      ".map(d => [d.dataset.name, Number(d.querySelector('.n').textContent)]))")
    check("live counters show the claims made", counters.get("claims acquired", 0) >= 5, counters)
    info = b.eval("document.getElementById('info').textContent")
    check("the store is named", "redis://" in info, info)
    html = b.eval("document.documentElement.outerHTML")
    check("the store's password is nowhere in the page", PASSWORD not in html)

    # Forget, with confirmation: Cancel keeps the record, Forget removes it.
    def click_forget(key):
        b.eval("[...document.querySelectorAll('#records button.danger')]"
               ".find(x => x.dataset.key === %s).click()" % json.dumps(key))
        return b.wait_for("document.getElementById('confirm').open")

    check("Forget asks first", click_forget("web-forget-me") is True)
    check("the question names the key",
          b.eval("document.getElementById('confirm-key').textContent") == "web-forget-me")
    check("it warns that the record is in progress (confirming forces the forget)",
          b.eval("document.getElementById('confirm-leased').hidden") is False)
    b.eval("document.getElementById('confirm-cancel').click()")
    time.sleep(0.5)
    check("Cancel keeps the record", api("GET", "/v1/keys/web-forget-me") == 200)
    click_forget("web-forget-me")
    b.eval("document.getElementById('confirm-forget').click()")
    check("Forget removes it", b.wait_for(
        "document.body.dataset.forgotten === 'web-forget-me'") is True
          and api("GET", "/v1/keys/web-forget-me") == 404)
    gone = b.wait_for("![...document.querySelectorAll('#records td.key')]"
                      ".some(e => e.textContent === 'web-forget-me')")
    check("... and the page no longer lists it", gone is True)

    # A record the store cannot decode is listed, with why, and can be forgotten.
    bad = b.eval("""(() => {
      const tr = [...document.querySelectorAll('#records tbody tr')]
        .find(r => r.querySelector('td.key').textContent === 'web-unreadable');
      return tr ? [...tr.children].map(td => td.textContent) : null;
    })()""")
    check("an undecodable record is listed as such, with why",
          bad is not None and bad[1] == "undecodable" and "not dedup format" in bad[2], bad)
    check("... and the page says how many",
          "1 undecodable" in b.eval("document.getElementById('page-note').textContent"))
    check("... and the other records are still listed", "web-completed" in keys, keys)
    order = b.eval("[...document.querySelectorAll('#records td.key')].map(e => e.textContent)")
    check("... in key order with them", order == sorted(order), order)
    check("its own GET answers 500 DATA_LOSS", api("GET", "/v1/keys/web-unreadable") == 500)
    req = urllib.request.Request(BASE + "/v1/keys?prefix=web-u",
                                 headers={"Authorization": "Bearer " + TOKEN})
    with urllib.request.urlopen(req, timeout=10) as r:
        listed = json.load(r)
    # Paged one entry at a time, records and undecodable keys together: each key
    # once, in key order, the undecodable one included.
    walked, cursor = [], ""
    for _ in range(50):
        req = urllib.request.Request(
            BASE + "/v1/keys?limit=1" + ("&after=" + urllib.parse.quote(cursor) if cursor else ""),
            headers={"Authorization": "Bearer " + TOKEN})
        with urllib.request.urlopen(req, timeout=10) as r:
            page = json.load(r)
        walked += [e["key_b64"] for e in page["records"] + page["undecodable"]]
        if len(page["records"]) + len(page["undecodable"]) != 1:
            check("a page of limit=1 holds one entry", False, page)
            break
        if not page["next"]:
            break
        cursor = page["next"]
    keys_walked = [base64.b64decode(k) for k in walked]
    check("paging by 1 walks every key once, in key order, undecodable included",
          keys_walked == sorted(set(keys_walked)) and b"web-unreadable" in keys_walked
          and b"web-completed" in keys_walked, keys_walked)
    check("the API lists it in undecodable, with key_b64 and why",
          listed["records"] == [] and len(listed["undecodable"]) == 1
          and listed["undecodable"][0]["key"] == "web-unreadable"
          and listed["undecodable"][0]["key_b64"] == "d2ViLXVucmVhZGFibGU="
          and listed["undecodable"][0]["why"].startswith("record is not dedup format"), listed)
    click_forget("web-unreadable")
    check("Forget of it does not warn of a lease",
          b.eval("document.getElementById('confirm-leased').hidden") is True)
    b.eval("document.getElementById('confirm-forget').click()")
    check("Forget removes it", b.wait_for(
        "document.body.dataset.forgotten === 'web-unreadable'") is True
          and api("GET", "/v1/keys/web-unreadable") == 404)

    # Filtering by prefix.
    b.eval("document.getElementById('prefix').value = 'web-c'; "
           "document.querySelector('#filter button').click()")
    only = b.wait_for("""(() => { const k = [...document.querySelectorAll('#records td.key')]
        .map(e => e.textContent); return k.length === 1 && k[0] === 'web-completed' ? k : null; })()""")
    check("a prefix narrows the list", only == ["web-completed"], only)

    if SHOT:
        b.eval("document.getElementById('prefix').value = ''; "
               "document.querySelector('#filter button').click()")
        b.wait_for("document.querySelectorAll('#records tbody tr').length > 3")
        time.sleep(0.3)
        png = b.send("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        with open(SHOT, "wb") as f:
            f.write(base64.b64decode(png))
        print("page: screenshot in " + SHOT)
finally:
    b.close()

sys.exit(1 if failures else 0)
