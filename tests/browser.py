"""Debian's headless Chromium, driven over the Chrome DevTools Protocol (websocket-client).

Nothing is downloaded: the browser is /usr/bin/chromium (apt), started with a fresh profile and
with every host name except loopback made unresolvable, so the page can only reach the test server.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import websocket

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-quic", "--disable-sync",
         "--disable-extensions", "--disable-dev-shm-usage", "--no-default-browser-check", "--mute-audio",
         "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


class Browser:
    """`with Browser() as b:` one page; `b.call(method, **params)`, `b.evaluate(js)`, `b.screenshot(path)`."""

    def __init__(self, binary: str = CHROMIUM, width: int = 1400, height: int = 1000, timeout_s: float = 60):
        self.binary, self.width, self.height, self.timeout_s = binary, width, height, timeout_s
        self._ids = itertools.count(1)

    def __enter__(self) -> "Browser":
        self.profile = Path(tempfile.mkdtemp(prefix="hartonomous-chromium-"))
        self.log = open(self.profile.parent / f"{self.profile.name}.log", "w+")
        self.proc = subprocess.Popen([self.binary, *FLAGS, f"--user-data-dir={self.profile}",
                                      f"--window-size={self.width},{self.height}", "about:blank"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        try:
            port = self._devtools_port()
            pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                     if t["type"] == "page"]
            self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=self.timeout_s,
                                                  suppress_origin=True)
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _devtools_port(self) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while not (marker.exists() and marker.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"chromium did not start: {self.log.read()[-2000:]}")
            time.sleep(0.05)
        return int(marker.read_text().split()[0])

    def __exit__(self, *exc) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
        Path(self.log.name).unlink(missing_ok=True)

    def call(self, method: str, **params) -> dict:
        """Send one CDP command and return its result (events in between are skipped)."""
        message_id = next(self._ids)
        self.ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def navigate(self, url: str) -> None:
        """Open `url` and wait until its document has loaded."""
        self.call("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'", f"{url} loaded")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout_s: float | None = None):
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                state = self.evaluate("document.body ? document.body.innerText.slice(0, 3000) : ''")
                raise AssertionError(f"the page never showed {what}; it shows:\n{state}")
            time.sleep(0.05)
        return value

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element."""
        box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
