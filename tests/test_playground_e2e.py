"""The playground end to end in headless Chromium: both panes stream, the chart draws, a screenshot is saved."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import psycopg
import pytest

from browser import CHROMIUM, Browser
from generation_helpers import SMOLLM2_ON_TWO_CORES, distilled_tiny_set, tiny_atom_set
from server_helpers import GatedModel, live_app
from test_generate_default_path import corpus_set, tiny_dir  # noqa: F401  (module fixtures)

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
                f"document.getElementById('atom_set').value = {json.dumps(atom_set)}",
                *[f"document.getElementById('use-{p}').checked = {json.dumps(p in ('spatial', 'exact'))}"
                  for p in ("spatial", "exact", "speculative", "augmented", "hybrid")]]
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


def tokens_of(browser: Browser, path: str, field: str = "origin") -> list[str]:
    return browser.evaluate(f"[...document.querySelectorAll('#pane-{path} .generated .tok')].map(s => s.dataset.{field} "
                            "?? null)")


@pytest.fixture(scope="module")
def distilled_set(server_url, tmp_path_factory):
    """A set distilled from the tiny model (often right as a drafter), so both kinds of token show."""
    with distilled_tiny_set(server_url, tmp_path_factory.mktemp("corpus")) as name:
        yield name


def generate_in_panes(browser: Browser, atom_set: str, settings: dict, hybrid: bool) -> dict:
    """Generate on the spatial, exact, speculative (and hybrid) panes with `atom_set`; what the
    speculative and hybrid panes show."""
    fill = [f"document.getElementById('prompt').value = {json.dumps(PROMPT)}",
            f"document.getElementById('atom_set').value = {json.dumps(atom_set)}",
            "document.getElementById('use-spatial').checked = true",
            "document.getElementById('use-speculative').checked = true",
            "document.getElementById('use-augmented').checked = false",
            f"document.getElementById('use-hybrid').checked = {json.dumps(hybrid)}"]
    fill += [f"document.getElementById('{k}').value = '{v}'" for k, v in settings.items()]
    browser.evaluate("; ".join(fill))
    browser.click("#generate")
    for path in ("speculative", "spatial", "exact") + (("hybrid",) if hybrid else ()):
        browser.wait_for(f"{pane(path, 'dataset.state')} === 'done' && !document.getElementById('generate').disabled",
                         f"the {path} pane finishing")
    text = lambda p: browser.evaluate(pane(p, "querySelector('.generated').textContent"))  # noqa: E731
    stats = lambda p: browser.evaluate(pane(p, "querySelector('.spec-stats').textContent"))  # noqa: E731
    return {"origins": tokens_of(browser, "speculative"), "routes": tokens_of(browser, "hybrid"),
            "sources": tokens_of(browser, "speculative", "source"),
            "source_colours": browser.evaluate("[...document.querySelectorAll('#pane-speculative .generated .tok')]"
                                               ".map(s => getComputedStyle(s).backgroundColor)"),
            "text": text("speculative"), "exact_text": text("exact"), "spec_stats": stats("speculative"),
            "hybrid_stats": stats("hybrid"), "count": int(browser.evaluate(pane("speculative", "dataset.tokens")))}


def test_the_speculative_and_hybrid_panes_colour_each_token_by_where_it_came_from(server_url, reader_url,
                                                                                  distilled_set, atom_set):
    """Speculative: each token drafted-and-kept or the exact model's own, the counts matching the run's
    stats (a drafter distilled from the model is kept, a random one never); hybrid: each step's
    route, as the API streams it."""
    import psycopg

    from hartonomous.risk import RiskModel
    from server_helpers import tiny_exact_model

    risk = RiskModel(features=["top_probability"], mean=[0.5], scale=[0.2], coef=[-2.0], intercept=0.0)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("UPDATE atom_sets SET risk_model = %s::jsonb WHERE name = %s",
                     (risk.model_dump_json(), distilled_set))
    # The browser's run and the API's run below must draft alike: draft lengths from fixed forward
    # costs (SmolLM2's on two cores), not from timing this tiny model beside the rest of the suite.
    exact_model = tiny_exact_model()
    exact_model._hartonomous_forward_costs = SMOLLM2_ON_TWO_CORES
    server, _ = live_app(reader_url, distilled_set, exact_model=exact_model)
    settings = {**SETTINGS, "temperature": 0.0}
    with server as url, Browser() as browser:
        browser.navigate(url + "/")
        browser.wait_for(f"[...document.querySelectorAll('#atom_set option')].filter(o => o.value === "
                         f"{json.dumps(distilled_set)} || o.value === {json.dumps(atom_set)}).length === 2",
                         "both atom sets in the selector")
        shown = {distilled_set: generate_in_panes(browser, distilled_set, settings, hybrid=True)}
        browser.screenshot(ARTIFACT.with_name("playground-speculative-hybrid.png"))
        # the random set has no risk predictor: no hybrid pane for it
        shown[atom_set] = generate_in_panes(browser, atom_set, settings, hybrid=False)
        streamed = httpx.post(f"{url}/api/generate/stream", timeout=60, json={
            "prompt": PROMPT, "atom_set": distilled_set, "details": True, "path": "hybrid", **settings}).text
        drafted = httpx.post(f"{url}/api/generate/stream", timeout=60, json={
            "prompt": PROMPT, "atom_set": distilled_set, "details": True, "path": "speculative", "sources": True,
            **settings}).text

    for name, kind in ((distilled_set, "draft"), (atom_set, "exact")):
        got = shown[name]
        assert got["text"] == got["exact_text"]                     # greedy: the exact path's text
        assert len(got["origins"]) == got["count"] > 0 and kind in got["origins"], (name, got["origins"])
        assert set(got["origins"]) <= {"draft", "exact"}
        assert f"({got['origins'].count('draft')}/" in got["spec_stats"], got   # "acceptance a (accepted/drafted)"
    events = lambda text: [json.loads(line[len("data: "):]) for line in text.splitlines()  # noqa: E731
                           if line.startswith('data: {"token"') and '"token_id"' in line]
    routes = [e.get("route") for e in events(streamed)]
    # each kept draft also carries its atom's source, as the API streams it (greedy: the same run),
    # and is coloured by it; the exact model's own tokens carry none
    spec = shown[distilled_set]
    api_sources = [e.get("source") for e in events(drafted)]
    assert spec["sources"] == api_sources
    assert all((src is not None) == (origin == "draft") for src, origin in zip(spec["sources"], spec["origins"]))
    assert set(spec["sources"]) - {None} <= {"corpus", "self-distilled", "memory", "context"}
    assert {src for src in spec["sources"] if src}, "no kept draft named its source"
    colour = {src: c for src, c in zip(spec["sources"], spec["source_colours"])}
    assert len(set(colour.values())) == len(colour)                   # one colour per source (and for exact)
    hybrid = shown[distilled_set]
    assert hybrid["routes"] == routes and set(routes) <= {"spatial", "exact"}
    assert f"{routes.count('exact')} of {len(routes)} steps exact" in hybrid["hybrid_stats"]


@pytest.fixture
def default_code_set(server_url, corpus_set):  # noqa: F811
    """The corpus-labelled, gated set as the database's default for one test (the previous default after)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        before = conn.execute("SELECT name FROM atom_sets WHERE is_default").fetchone()
        make_default(conn, corpus_set)
        try:
            yield corpus_set
        finally:
            make_default(conn, before[0] if before else None)


def make_default(conn, name: str | None) -> None:
    conn.execute("UPDATE atom_sets SET is_default = false WHERE is_default")
    conn.execute("UPDATE atom_sets SET is_default = true WHERE name = %s", (name,))


def test_the_playground_opens_on_a_code_store_with_the_exact_augmented_and_speculative_panes(reader_url,
                                                                                           default_code_set):
    """On a default set with corpus labels and a gate (make demo's code store), the page ticks the
    exact, augmented and speculative panes; spatial is one click away. The screenshot is
    test-artifacts/playground-code.png (the tiny model's; the README's, on the real code store, is
    scripts/playground_screenshot.py's)."""
    artifact = ARTIFACT.with_name("playground-code.png")
    server, _ = live_app(reader_url, default_code_set)
    with server as url, Browser() as browser:
        served = httpx.get(f"{url}/api/atom_sets", timeout=30).json()
        browser.navigate(url + "/")
        browser.wait_for(f"[...document.querySelectorAll('#atom_set option')].some(o => o.value === "
                         f"{json.dumps(default_code_set)})", "the atom set in the selector")
        ticked = browser.evaluate("[...document.querySelectorAll('#controls input[type=checkbox][id^=use-]')]"
                                  ".filter(c => c.checked).map(c => c.id.slice(4))")
        visible = browser.evaluate("[...document.querySelectorAll('.pane')].filter(p => !p.hidden)"
                                   ".map(p => p.dataset.path)")
        fill = [f"document.getElementById('prompt').value = {json.dumps('def add(a, b):')}"]
        fill += [f"document.getElementById('{k}').value = '{v}'" for k, v in
                 {**SETTINGS, "max_new_tokens": 12, "temperature": 0}.items()]
        browser.evaluate("; ".join(fill))
        browser.click("#generate")
        for path in ticked:
            browser.wait_for(f"{pane(path, 'dataset.state')} === 'done'", f"the {path} pane finishing")
        texts = {p: browser.evaluate(pane(p, "querySelector('.generated').textContent")) for p in ticked}
        artifact.parent.mkdir(exist_ok=True)
        browser.screenshot(artifact)
        browser.evaluate("document.getElementById('use-spatial').click()")
        browser.click("#generate")
        browser.wait_for(f"{pane('spatial', 'dataset.state')} === 'done' && "
                         "!document.getElementById('generate').disabled", "the spatial pane after one click")
        spatial_hidden = browser.evaluate(pane("spatial", "hidden"))
    code_set = next(s for s in served["atom_sets"] if s["name"] == default_code_set)
    assert served["default"] == default_code_set and "augmented" in code_set["paths"]
    assert sorted(ticked) == sorted(visible) == ["augmented", "exact", "speculative"]
    assert texts["speculative"] == texts["exact"] and all(texts.values())    # greedy: the exact model's words
    assert not spatial_hidden
    assert artifact.stat().st_size > 10_000
