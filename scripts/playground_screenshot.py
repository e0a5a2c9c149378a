"""The playground on the real code store, on a held-out file: a screenshot of what `make demo` gives.

Starts `hartonomous serve` (SmolLM2, the database's default set, `make demo`'s `code` store), opens
the playground in Debian's headless Chromium (tests/browser.py: no download, loopback only), asks for
the continuation of the first lines of a file the store never read (the set's held-out test text,
held out by path at build time), greedy, in the exact, augmented and speculative panes the page opens
with on such a set, waits for all three, and saves the page as a PNG, with a JSON beside it: the
prompt, its source, each pane's text and figures, the command and the machine's load.

    .venv/bin/python scripts/playground_screenshot.py [--atom-set code] [--lines 30] [--new-tokens 48] \\
        [--out docs/img/playground-code-store.png]

Needs the code store (`make demo` builds it; `hartonomous atom-sets` lists it) and /usr/bin/chromium
(scripts/install-system-deps.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from hartonomous.paths import DECLARATIONS, PATHS  # noqa: E402  (light: no model code)

PANES = tuple(name for name, declared in DECLARATIONS.items() if declared.shown)   # the panes the page opens on


def held_out_head(atom_set: str, lines: int) -> tuple[str, str]:
    """The first `lines` lines of the set's held-out test text (whole files the build never read), and
    where that text comes from."""
    import psycopg

    from hartonomous.atomset import load_atom_set
    from hartonomous.compare.atomset import holdout_text
    from hartonomous.db.connection import reader_url

    with psycopg.connect(reader_url(), autocommit=True) as conn:
        info = load_atom_set(conn, atom_set)
    text = holdout_text(info, "test")
    return "".join(text.text.splitlines(keepends=True)[:lines]), text.source


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    """Until /healthz answers with the exact model loaded (the serve process's log on failure)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: hartonomous serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            health = httpx.get(url + "/healthz", timeout=5)
            if health.status_code == 200 and health.json()["exact_model"].startswith("loaded"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"error: hartonomous serve was not ready in {timeout_s:.0f} s; see {log}")


def pane(path: str, what: str) -> str:
    return f"document.getElementById('pane-{path}').{what}"


def capture(url: str, atom_set: str, prompt: str, new_tokens: int, out: Path) -> dict:
    """Generate in the page's panes on `atom_set`; save the screenshot; what each pane shows."""
    sys.path.insert(0, str(ROOT / "tests"))
    from browser import Browser

    with Browser(width=1400, height=1200, timeout_s=600) as browser:
        browser.navigate(url + "/")
        browser.wait_for("document.getElementById('health').classList.contains('ok')", "a healthy server")
        browser.wait_for(f"[...document.querySelectorAll('#atom_set option')].some(o => o.value === "
                         f"{json.dumps(atom_set)})", f"the atom set {atom_set} in the selector")
        settings = {"atom_set": atom_set, "max_new_tokens": new_tokens, "temperature": 0, "top_k": 0, "top_p": 1,
                    "repetition_penalty": 1, "seed": 1}
        fill = [f"document.getElementById('prompt').value = {json.dumps(prompt)}",
                f"document.getElementById('prompt').rows = {min(prompt.count(chr(10)) + 1, 32)}",
                *[f"document.getElementById('{k}').value = {json.dumps(str(v))}" for k, v in settings.items()],
                *[f"document.getElementById('use-{p}').checked = {json.dumps(p in PANES)}"
                  for p in PATHS]]
        browser.evaluate("; ".join(fill))
        browser.click("#generate")
        for path in PANES:
            browser.wait_for(f"{pane(path, 'dataset.state')} === 'done'", f"the {path} pane finishing")
        shown = {p: {"text": browser.evaluate(pane(p, "querySelector('.generated').textContent")),
                     "tokens": browser.evaluate(pane(p, "dataset.tokens")),
                     "state": browser.evaluate(pane(p, "querySelector('.state').textContent")),
                     "rate": browser.evaluate(pane(p, "querySelector('.rate').textContent"))} for p in PANES}
        browser.screenshot(out)
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atom-set", default="code", help="a set with corpus labels and a gate (default: code)")
    parser.add_argument("--lines", type=int, default=30, help="the held-out file's first lines asked for (30)")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "playground-code-store.png")
    args = parser.parse_args(argv)
    if args.lines < 1 or not 1 <= args.new_tokens <= 512:
        parser.error("--lines must be positive and --new-tokens within 1..512")
    if not Path("/usr/bin/chromium").exists():
        raise SystemExit("error: needs Debian's chromium (scripts/install-system-deps.sh, or apt-get install chromium)")
    prompt, source = held_out_head(args.atom_set, args.lines)
    load_before = os.getloadavg()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    exe = str(Path(sys.executable).with_name("hartonomous"))
    with tempfile.TemporaryDirectory(prefix="playground-screenshot-") as logs:
        log = Path(logs) / "serve.log"
        with log.open("w") as out:
            proc = subprocess.Popen([exe, "serve", "--port", str(port), "--atom-set", args.atom_set,
                                     "--log-level", "warning"], stdout=out, stderr=subprocess.STDOUT)
            try:
                wait_ready(url, proc, log)
                shown = capture(url, args.atom_set, prompt, args.new_tokens, args.out)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    record = {"command": shlex.join([".venv/bin/python", *sys.argv]), "atom_set": args.atom_set,
              "prompt_source": source, "prompt_lines": args.lines, "prompt": prompt, "new_tokens": args.new_tokens,
              "panes": shown, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"{args.out} ({args.out.stat().st_size:,} bytes); panes: "
          + "; ".join(f"{p} {s['tokens']} tokens, {s['rate']}" for p, s in shown.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
