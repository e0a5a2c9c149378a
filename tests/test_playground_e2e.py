"""The playground end to end in headless Chromium: both panes stream, the chart draws, a screenshot is saved."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from browser import CHROMIUM, Browser
from generation_helpers import tiny_atom_set
from server_helpers import GatedModel, live_app

ARTIFACT = Path(__file__).resolve().parent.parent / "test-artifacts" / "playground.png"
PROMPT = "The capital of France is"
SETTINGS = {"max_new_tokens": 24, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1,
            "seed": 3}

if not os.path.exists(CHROMIUM):
    if os.environ.get("CI"):
        pytest.fail("CI needs Debian's chromium; scripts/install-system-deps.sh installs it", pytrace=False)
    pytest.skip("needs Debian's chromium (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def atom_set(server_url):
    with tiny_atom_set(server_url, seed=8) as name:
        yield name


def pane(path: str, what: str) -> str:
    return f"document.getElementById('pane-{path}').{what}"


def test_playground_streams_both_paths_side_by_side(reader_url, atom_set):
    model = GatedModel()             # the exact pane advances only when the test releases a step
    server, _ = live_app(reader_url, atom_set, exact_model=model)
    with server as url, Browser() as browser:
        browser.navigate(url + "/")
        browser.wait_for("document.getElementById('health').classList.contains('ok')", "a healthy database")
        browser.wait_for(f"[...document.querySelectorAll('#atom_set option')].some(o => o.value === "
                         f"{json.dumps(atom_set)})", "the atom set in the selector")
        fill = [f"document.getElementById('prompt').value = {json.dumps(PROMPT)}",
                f"document.getElementById('atom_set').value = {json.dumps(atom_set)}"]
        fill += [f"document.getElementById('{k}').value = '{v}'" for k, v in SETTINGS.items()]
        browser.evaluate("; ".join(fill))
        browser.click("#generate")

        model.permits.release(2)     # three exact tokens, then the exact stream waits mid-generation
        browser.wait_for(f"{pane('exact', 'dataset.tokens')} === '3' && "
                         f"{pane('exact', 'dataset.state')} === 'streaming'", "exact tokens while streaming")
        browser.wait_for(f"{pane('spatial', 'dataset.state')} === 'done'", "the spatial pane finishing")
        model.permits.release(SETTINGS["max_new_tokens"])
        browser.wait_for(f"{pane('exact', 'dataset.state')} === 'done'", "the exact pane finishing")

        shown = {p: browser.evaluate(pane(p, "querySelector('.generated').textContent")) for p in ("spatial", "exact")}
        counts = {p: browser.evaluate(pane(p, "dataset.tokens")) for p in ("spatial", "exact")}
        rates = {p: browser.evaluate(pane(p, "querySelector('.rate').textContent")) for p in ("spatial", "exact")}
        states = {p: browser.evaluate(pane(p, "querySelector('.state').textContent")) for p in ("spatial", "exact")}
        bars = browser.evaluate("document.querySelectorAll('#chart rect.bar').length")
        labels = browser.evaluate("[...document.querySelectorAll('#chart text')].map(t => t.textContent)")
        caption = browser.evaluate("document.getElementById('chart-caption').textContent")
        browser.screenshot(ARTIFACT)

        model.permits.release(10 * SETTINGS["max_new_tokens"])     # for the reference runs below
        expected = {p: httpx.post(f"{url}/api/generate", timeout=60, json={
            "prompt": PROMPT, "path": p, "atom_set": atom_set, **SETTINGS}).json() for p in ("spatial", "exact")}
        last = httpx.post(f"{url}/api/generate/stream", timeout=60, json={
            "prompt": PROMPT, "atom_set": atom_set, "details": True, "top_n": 12, **SETTINGS}).text

    for p in ("spatial", "exact"):
        assert shown[p] and shown[p] == expected[p]["text"], p
        assert counts[p] == str(len(expected[p]["token_ids"])), p
        assert rates[p].endswith("tokens/s") and float(rates[p].split()[0]) > 0, rates[p]
        assert states[p].startswith("complete") or states[p].startswith("stopped"), states[p]
    last_step = [json.loads(line[len("data: "):]) for line in last.splitlines()
                 if line.startswith('data: {"token"')][-1]
    assert bars == len(last_step["distribution"]) > 0
    assert any(f"#{last_step['distribution'][0]['token_id']}" in label for label in labels)
    assert f"step {last_step['step']}:" in caption and f"picked #{last_step['token_id']} " in caption
    assert ARTIFACT.stat().st_size > 10_000
