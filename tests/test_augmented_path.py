"""The augmented path, wired everywhere a path is offered: p = (1 − λ) p_exact + λ p_store.

On a real database with a context set built with corpus labels from the tiny model's training
text, a hand-written gate beside it, and the tiny random-weight model as the exact model:
λ = 0 is the exact path, λ = 1 the store (SQL store_distribution) under the same sampler, a
λ in between the mixture; events carry λ and whether the store's top token won; result.stats
sums them up; a set without a gate or without corpus labels, a set built from another model than
the exact one, and a λ outside [0, 1], are refused by the Client, the CLI (one line, non-zero
exit) and HTTP (400, or 422 naming the field); the path is never remembered; `bench --augmented`
measures it beside the exact path. Speculative decoding with the augmented target
(`speculative_target="augmented"`) gives the augmented path's greedy output, says so in its
stats, is never remembered, and bad targets are refused everywhere.
"""

from __future__ import annotations

import json
import math
import uuid

import httpx
import numpy as np
import psycopg
import pytest
import torch

from generation_helpers import drop_atom_set, run_cli, save_tiny_model, write_tiny_atom_set
from hartonomous import sqlcalls
from hartonomous.augment.gate import FEATURES, Gate, feature_row
from hartonomous.augment.gates import save_gate
from hartonomous.client import Client
from hartonomous.engine import Engine
from hartonomous.errors import InvalidArgument, UserError
from hartonomous.runtimes.reference import ExactModel
from hartonomous.generation_config import GenerationConfig
from hartonomous.memory import REMEMBERED_PATHS, MemoryPolicy, MemoryWriter
from speculative_helpers import tiny_exact_backend
from tiny_model import TRAIN_TEXT, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

PROMPTS = ["The capital of France is", "def add(a, b):"]
PAST_EOS = MemoryPolicy(allow_ignore_eos=True)   # the memory tests run greedy past EOS: their set's owner allows it
SAMPLED = dict(max_new_tokens=12, temperature=1.0, top_k=40, top_p=0.9, seed=7, stop_at_eos=False)
PLAIN = dict(max_new_tokens=10, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=3,
             stop_at_eos=False)          # the sampler changes nothing: the distribution is the path's own
# A hand-picked gate (FEATURES order): trust the store where it is close, sure and agrees with the model.
COEFFICIENTS = {"closeness": 0.4, "exact_match": 0.6, "ln_mass": 0.3, "store_top": 1.5, "store_entropy": -0.5,
                "agree": 0.8}
GATE = Gate(FEATURES, means=(0.0,) * len(FEATURES), scales=(1.0,) * len(FEATURES),
            coefficients=tuple(COEFFICIENTS.get(f, 0.0) for f in FEATURES), intercept=-1.0,
            calibration_loss=2.0, exact_loss=2.5, positions=100)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The tiny model as a local model folder: the model the corpus set is built from (`--model`)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def corpus_set(server_url, tmp_path_factory, tiny_dir):
    """A context set labelled with its corpus's own next tokens (`build --target corpus`), built from
    the tiny model's folder, with the hand-picked gate (not a fitted one: what λ is must not depend
    on a fit)."""
    from projection.build import BuildOptions, build

    model, tokenizer = tiny_model(0)
    corpus = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    corpus.write_text("\n".join(TRAIN_TEXT))
    name = f"tiny-corpus-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url) as conn:
        build(conn, BuildOptions(name=name, kind="context", model=str(tiny_dir), corpus=[corpus],
                                 max_tokens=3000, landmarks=64, target="corpus", gate=False),
              model=model, tokenizer=tokenizer)
    with psycopg.connect(server_url, autocommit=True) as conn:
        save_gate(conn, name, GATE)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture(scope="module")
def model_labelled_set(server_url):
    """A set with no corpus labels (hand-written token atoms)."""
    name = write_tiny_atom_set(server_url, model="tiny", window=3, decay=0.5)
    yield name
    drop_atom_set(server_url, name)


def client(url: str, atom_set: str, **options) -> Client:
    model, tokenizer = tiny_model(0)
    return Client(database_url=url, atom_set=atom_set, exact_model=ExactModel(model, tokenizer), **options)


def exact_probs(ids: list[int]) -> np.ndarray:
    """p_exact at T = 1 after ids, from a fresh exact model (V,)."""
    backend = tiny_exact_backend()
    logits = backend.start(list(ids)).logits
    return torch.softmax(logits.detach().to(torch.float64), -1).numpy()


def store_probs(conn, atom_set: str, ids: list[int], vocab: int) -> tuple[np.ndarray, object]:
    """p_store after ids, dense (V,), straight from SQL store_distribution, and the step itself."""
    step = sqlcalls.store_distribution(conn, ids, atom_set=atom_set)[-1]
    dense = np.zeros(vocab)
    dense[step.token_ids] = step.probabilities
    return dense, step


def as_dense(dist, vocab: int) -> np.ndarray:
    dense = np.zeros(vocab)
    dense[dist.token_ids] = dist.probabilities
    return dense


# -- λ = 0: the exact path, bit for bit --------------------------------------------------------------

@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_weight_zero_is_the_exact_path_token_for_token(server_url, corpus_set, repetition_penalty):
    config = GenerationConfig(**SAMPLED, repetition_penalty=repetition_penalty)
    with client(server_url, corpus_set, augment_weight=0) as c:
        augmented = c.engine("augmented")
        for prompt in PROMPTS:
            want = list(Engine(tiny_exact_backend()).session(prompt, config).events())
            got = list(augmented.session(prompt, config).events())
            assert [e.token_id for e in got] == [e.token_id for e in want]
            assert [e.probability for e in got] == [e.probability for e in want]
            for g, w in zip(got, want):
                assert g.distribution.token_ids == w.distribution.token_ids
                assert g.distribution.probabilities == w.distribution.probabilities
                assert g.weight == 0.0
        rows = c.next_token(PROMPTS[0], "augmented", repetition_penalty=repetition_penalty)
        assert rows == c.next_token(PROMPTS[0], "exact", repetition_penalty=repetition_penalty)


# -- λ = 1: the store's distribution; λ in between: the mixture ----------------------------------------

def test_weight_one_is_the_stores_distribution(server_url, corpus_set):
    config = GenerationConfig(**PLAIN)
    with client(server_url, corpus_set, augment_weight=1) as c, psycopg.connect(server_url, autocommit=True) as conn:
        session = c.engine("augmented").session(PROMPTS[1], config)
        ids, vocab = list(session.prompt_ids), tiny_exact_backend().model.vocab_size
        for event in session.events():
            want, step = store_probs(conn, corpus_set, ids, vocab)
            assert step.token_ids, "the store has candidates at every step of this prompt"
            assert set(event.distribution.token_ids) == set(step.token_ids)
            np.testing.assert_allclose(as_dense(event.distribution, vocab), want, rtol=0, atol=1e-12)
            ids.append(event.token_id)


@pytest.mark.parametrize("weight", [0.25, 0.7])
def test_a_weight_between_mixes_the_two_distributions(server_url, corpus_set, weight):
    config = GenerationConfig(**PLAIN)
    with client(server_url, corpus_set, augment_weight=weight) as c, \
            psycopg.connect(server_url, autocommit=True) as conn:
        session = c.engine("augmented").session(PROMPTS[0], config)
        ids = list(session.prompt_ids)
        vocab = tiny_exact_backend().model.vocab_size
        for event in session.events():
            p_store, _ = store_probs(conn, corpus_set, ids, vocab)
            want = (1 - weight) * exact_probs(ids) + weight * p_store
            np.testing.assert_allclose(as_dense(event.distribution, vocab), want, rtol=0, atol=1e-6)
            assert event.weight == weight
            ids.append(event.token_id)


# -- the gate: λ per step, on the events and in the statistics ------------------------------------------

def test_the_gate_sets_each_steps_weight_and_the_stats_sum_them_up(server_url, corpus_set):
    config = GenerationConfig(**SAMPLED)
    with client(server_url, corpus_set) as c, psycopg.connect(server_url, autocommit=True) as conn:
        session = c.engine("augmented").session(PROMPTS[0], config)
        ids = list(session.prompt_ids)
        events = []
        for event in session.events():
            _, step = store_probs(conn, corpus_set, ids, tiny_exact_backend().model.vocab_size)
            assert event.weight == pytest.approx(GATE.weight(feature_row(step, exact_probs(ids))), abs=1e-9)
            top = step.token_ids[int(np.argmax(step.probabilities))] if step.token_ids else None
            assert event.store_top == (event.token_id == top)
            events.append(event)
            ids.append(event.token_id)
    weights = [e.weight for e in events]
    assert len(set(weights)) > 1 and all(0 < w < 1 for w in weights)          # the gate moves with the step
    stats = session.result.stats
    assert session.result.path == "augmented"
    assert stats.as_dict() == {"steps": len(events), "mean_weight": pytest.approx(sum(weights) / len(weights)),
                               "store_top_picked": sum(bool(e.store_top) for e in events)}


def test_next_token_gives_the_augmented_distribution(server_url, corpus_set):
    with client(server_url, corpus_set) as c:
        rows = c.next_token(PROMPTS[1], "augmented", temperature=1.0, top_k=0)
        dist = c.engine("augmented").distribution(PROMPTS[1], GenerationConfig(temperature=1.0, top_k=0))
    assert [r.token_id for r in rows] == dist.token_ids
    assert sum(r.probability for r in rows) == pytest.approx(1.0)
    assert rows != []


# -- refusals ------------------------------------------------------------------------------------------

def test_a_set_without_a_gate_is_refused_with_how_to_fit_one(server_url, corpus_set):
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("DELETE FROM augment_gates g USING atom_sets s WHERE s.id = g.atom_set_id AND s.name = %s",
                     (corpus_set,))
        try:
            with client(server_url, corpus_set) as c, pytest.raises(UserError, match="hartonomous gate fit"):
                c.generate(PROMPTS[0], "augmented", max_new_tokens=2)
        finally:
            save_gate(conn, corpus_set, GATE)


def test_a_set_without_corpus_labels_is_refused(server_url, model_labelled_set):
    with client(server_url, model_labelled_set) as c, pytest.raises(UserError, match="corpus labels"):
        c.next_token(PROMPTS[0], "augmented")


@pytest.mark.parametrize("weight", [-0.1, 1.5, math.nan, math.inf, True, "0.5"])
def test_a_weight_outside_zero_to_one_is_refused_by_the_client(weight):
    with pytest.raises(InvalidArgument) as err:
        Client(augment_weight=weight)
    assert err.value.name == "augment_weight"


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory):
    """Another model folder with the same vocabulary (the same tiny weights, saved elsewhere)."""
    return save_tiny_model(tmp_path_factory.mktemp("other"))


def test_a_set_built_from_another_model_is_refused_naming_both(server_url, corpus_set, tiny_dir, other_dir):
    handed_in = dict(exact_model=ExactModel(*tiny_model(0)))
    for options, exact in [(dict(model=str(other_dir)), str(other_dir)),      # refused before it loads
                           (dict(model="smollm2", **handed_in), "smollm2")]:  # a loaded model named by `model`
        with Client(database_url=server_url, atom_set=corpus_set, **options) as c, \
                pytest.raises(UserError) as err:
            c.generate(PROMPTS[0], "augmented", max_new_tokens=2)
        message = str(err.value)
        assert f"built from model '{tiny_dir}'" in message and f"the exact model is '{exact}'" in message
        assert f"--model {tiny_dir}" in message and "\n" not in message
        if "exact_model" not in options:
            assert c.exact_runtime is None                                    # no model was loaded to find out
    spelled_otherwise = tiny_dir.parent / "." / tiny_dir.name                 # the same folder is the same model
    with Client(database_url=server_url, atom_set=corpus_set, model=str(spelled_otherwise), device="cpu") as c:
        assert len(c.generate(PROMPTS[0], "augmented", max_new_tokens=2, stop_at_eos=False).token_ids) == 2


def test_the_augmented_path_is_never_remembered(server_url, corpus_set):
    assert "augmented" not in REMEMBERED_PATHS
    writer = MemoryWriter(server_url, policy=PAST_EOS)
    writer.forget(corpus_set)
    options = dict(max_new_tokens=6, temperature=0.0, stop_at_eos=False)
    try:
        with client(server_url, corpus_set, remember=writer) as c:
            result = c.generate(PROMPTS[0], "augmented", **options)
            assert result.finish_reason == "length" and len(result.token_ids) == 6
            assert writer.status(corpus_set).atoms == 0 and writer.failed == 0
            c.generate(PROMPTS[0], "exact", **options)              # the same writer does remember the exact path
            assert writer.status(corpus_set).atoms == 6
    finally:
        writer.forget(corpus_set)
        writer.close()


# -- the CLI -------------------------------------------------------------------------------------------

def store_tops_picked(conn, atom_set: str, prompt_ids: list[int], token_ids: list[int]) -> int:
    """How many of the generated tokens were the store's most probable token at their step, from SQL
    store_distribution on each step's context (independent of the path's own bookkeeping)."""
    picked, ids = 0, list(prompt_ids)
    for token in token_ids:
        step = sqlcalls.store_distribution(conn, ids, atom_set=atom_set)[-1]
        picked += bool(step.token_ids) and token == step.token_ids[int(np.argmax(step.probabilities))]
        ids.append(token)
    return picked


def test_cli_generate_reports_the_mean_weight_and_store_top_picks(capsys, database_env, server_url, corpus_set,
                                                                  tiny_dir):
    args = ["generate", PROMPTS[0], "--path", "augmented", "--seed", "3", "--max-new-tokens", "6", "--ignore-eos",
            "--atom-set", corpus_set, "--model", str(tiny_dir), "--device", "cpu"]
    code, out, _ = run_cli(capsys, *args, "--json")
    result = json.loads(out)
    stats = result["stats"]
    assert code == 0 and stats["steps"] == len(result["token_ids"]) == 6 and 0 < stats["mean_weight"] < 1
    with psycopg.connect(server_url, autocommit=True) as conn:
        picked = store_tops_picked(conn, corpus_set, result["prompt_ids"], result["token_ids"])
    assert stats["store_top_picked"] == picked
    code, out, err = run_cli(capsys, *args)                            # the same seed: the same run, in words
    assert code == 0 and out.strip()
    line = [x for x in err.splitlines() if x.startswith("[augmented] mean λ")]
    assert line == [f"[augmented] mean λ {stats['mean_weight']:.3f} over 6 steps; the store's most probable "
                    f"token picked at {picked}/6"]
    code, out, _ = run_cli(capsys, *args, "--augment-weight", "0", "--json")
    exact_args = [a if a != "augmented" else "exact" for a in args]
    code2, out2, _ = run_cli(capsys, *exact_args, "--json")
    assert code == code2 == 0 and json.loads(out)["token_ids"] == json.loads(out2)["token_ids"]
    code, out, _ = run_cli(capsys, "next-token", PROMPTS[0], "--path", "augmented", "--json", "--atom-set",
                           corpus_set, "--model", str(tiny_dir), "--device", "cpu")
    assert code == 0 and sum(r["probability"] for r in json.loads(out)) == pytest.approx(1.0)


@pytest.mark.parametrize("extra, message", [
    (["--augment-weight", "1.5"], "--augment-weight must be in [0, 1]"),
    (["--augment-weight", "nan"], "--augment-weight must be in [0, 1]"),
    (["--remember"], "--remember keeps only the exact model's words"),
])
def test_cli_refuses_a_bad_weight_in_one_line(capsys, extra, message):
    code, out, err = run_cli(capsys, "generate", PROMPTS[0], "--path", "augmented", *extra)
    assert code != 0 and not out
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_the_weight_on_another_path(capsys):
    code, _, err = run_cli(capsys, "next-token", PROMPTS[0], "--path", "exact", "--augment-weight", "0.5")
    assert code != 0 and "--augment-weight is for --path augmented" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("which, message", [("model_labelled_set", "corpus labels"),
                                            ("no_gate", "fit one with: hartonomous gate fit")])
def test_cli_refuses_a_set_it_cannot_augment_in_one_line(request, capsys, database_env, server_url, tiny_dir,
                                                        which, message):
    if which == "no_gate":
        name = request.getfixturevalue("corpus_set")
        conn = psycopg.connect(server_url, autocommit=True)
        conn.execute("DELETE FROM augment_gates g USING atom_sets s WHERE s.id = g.atom_set_id AND s.name = %s",
                     (name,))
    else:
        name, conn = request.getfixturevalue(which), None
    try:
        code, out, err = run_cli(capsys, "generate", PROMPTS[0], "--path", "augmented", "--atom-set", name,
                                 "--model", str(tiny_dir), "--device", "cpu", "--max-new-tokens", "2")
    finally:
        if conn is not None:
            save_gate(conn, name, GATE)
            conn.close()
    assert code != 0 and not out
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_a_set_of_another_model_in_one_line(capsys, database_env, corpus_set, tiny_dir, other_dir):
    code, out, err = run_cli(capsys, "generate", PROMPTS[0], "--path", "augmented", "--atom-set", corpus_set,
                             "--model", str(other_dir), "--device", "cpu", "--max-new-tokens", "2")
    assert code == 1 and not out and len(err.strip().splitlines()) == 1
    assert f"built from model '{tiny_dir}'" in err and f"the exact model is '{other_dir}'" in err


# -- HTTP and SSE --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def http(reader_url, corpus_set):
    """A live server on the reader role (it must read gates and call store_distribution)."""
    from server_helpers import WAIT_S, live_app

    server, _ = live_app(reader_url, corpus_set, pool_size=2)
    with server as url, httpx.Client(base_url=url, timeout=WAIT_S) as h:
        yield h


def sse(http: httpx.Client, body: dict) -> list[tuple[str, dict | str]]:
    from test_server import parse_sse

    with http.stream("POST", "/api/generate/stream", json=body) as response:
        assert response.status_code == 200, response.read()
        return [(event, data if data == "[DONE]" else json.loads(data))
                for event, data in parse_sse(response.iter_lines()) if event != "comment"]


def test_sse_events_carry_the_weight_and_the_result_the_stats(http):
    body = {"prompt": PROMPTS[0], "path": "augmented", "max_new_tokens": 6, "seed": 4, "ignore_eos": True}
    events = sse(http, {**body, "details": True})
    tokens = [data for event, data in events if event == "message" and data != "[DONE]" and "token_id" in data]
    result = next(data for event, data in events if event == "result")
    assert len(tokens) == 6 and all(0 < t["weight"] < 1 and isinstance(t["store_top"], bool) for t in tokens)
    assert result["path"] == "augmented"
    assert result["stats"] == {"steps": 6, "mean_weight": pytest.approx(sum(t["weight"] for t in tokens) / 6),
                               "store_top_picked": sum(t["store_top"] for t in tokens)}
    blocking = http.post("/api/generate", json=body).json()
    assert blocking["token_ids"] == [t["token_id"] for t in tokens] and blocking["stats"] == result["stats"]
    fixed = http.post("/api/generate", json={**body, "augment_weight": 0})
    exact = http.post("/api/generate", json={**body, "path": "exact"})
    assert fixed.status_code == exact.status_code == 200
    assert fixed.json()["token_ids"] == exact.json()["token_ids"]


def test_next_token_over_http(http):
    response = http.post("/api/next_token", json={"prompt": PROMPTS[1], "path": "augmented", "limit": 5})
    assert response.status_code == 200
    payload = response.json()
    assert payload["path"] == "augmented" and len(payload["rows"]) == 5 and payload["atom_set"]


@pytest.mark.parametrize("endpoint, weight", [("/api/generate", 1.5), ("/api/generate/stream", -0.5),
                                              ("/api/next_token", 2)])
def test_a_weight_outside_zero_to_one_is_422_naming_the_field(http, endpoint, weight):
    response = http.post(endpoint, json={"prompt": PROMPTS[0], "path": "augmented", "augment_weight": weight})
    assert response.status_code == 422
    assert "augment_weight" in [d["field"] for d in response.json()["detail"]]


def test_a_set_of_another_model_is_a_400_naming_both(reader_url, corpus_set, tiny_dir):
    """A server whose exact model is named otherwise than the set's refuses it, as it refuses a set
    without a gate (a user mistake: 400)."""
    from server_helpers import WAIT_S, live_app

    server, _ = live_app(reader_url, corpus_set, model="smollm2")
    with server as url, httpx.Client(base_url=url, timeout=WAIT_S) as h:
        bodies = [{"path": "augmented"}, {"path": "speculative", "speculative_target": "augmented"}]
        responses = [h.post("/api/generate", json={"prompt": PROMPTS[0], "max_new_tokens": 2, **b}) for b in bodies]
        exact = h.post("/api/generate", json={"prompt": PROMPTS[0], "max_new_tokens": 2, "path": "exact"})
    for response in responses:
        assert response.status_code == 400
        error = response.json()["error"]
        assert f"built from model '{tiny_dir}'" in error and "the exact model is 'smollm2'" in error
    assert exact.status_code == 200                   # the exact path reads no store: nothing to refuse


# -- speculative decoding with the augmented target -----------------------------------------------------

GREEDY = dict(max_new_tokens=12, temperature=0.0, stop_at_eos=False)


@pytest.mark.parametrize("weight", [None, 0.7])
def test_speculative_with_the_augmented_target_gives_the_augmented_paths_greedy_tokens(server_url, corpus_set,
                                                                                       weight):
    differs = []
    with client(server_url, corpus_set, speculative_target="augmented", augment_weight=weight, draft_tokens=3) as c:
        for prompt in PROMPTS:
            augmented = c.generate(prompt, "augmented", **GREEDY)
            speculative = c.generate(prompt, "speculative", **GREEDY)
            assert speculative.token_ids == augmented.token_ids and speculative.text == augmented.text
            assert speculative.path == "speculative" and speculative.stats.target == "augmented"
            assert speculative.stats.as_dict()["target"] == "augmented" and speculative.stats.rounds > 0
            differs.append(c.generate(prompt, "exact", **GREEDY).token_ids != augmented.token_ids)
    if weight is not None:
        assert any(differs), "with λ = 0.7 the store changes the greedy output somewhere (else this proves nothing)"


def test_the_exact_target_stays_the_default_and_says_so(server_url, corpus_set):
    with client(server_url, corpus_set) as c:
        result = c.generate(PROMPTS[0], "speculative", **GREEDY)
        assert result.token_ids == c.generate(PROMPTS[0], "exact", **GREEDY).token_ids
    assert result.stats.target == "exact" and result.stats.as_dict()["target"] == "exact"


def test_the_augmented_target_verifies_chains_only(server_url, corpus_set):
    with client(server_url, corpus_set, speculative_target="augmented", max_tree_width=3) as c, \
            pytest.raises(UserError, match="the augmented target verifies chains only"):
        c.generate(PROMPTS[0], "speculative", max_new_tokens=2)


@pytest.mark.parametrize("target", ["store", "Augmented", "", None, 1])
def test_an_unknown_speculative_target_is_refused_by_the_client(target):
    with pytest.raises(InvalidArgument) as err:
        Client(speculative_target=target)
    assert err.value.name == "speculative_target" and "exact, augmented" in str(err.value)


def test_the_augmented_target_is_never_remembered(server_url, corpus_set):
    writer = MemoryWriter(server_url, policy=PAST_EOS)
    writer.forget(corpus_set)
    options = dict(max_new_tokens=6, temperature=0.0, stop_at_eos=False)
    try:
        with client(server_url, corpus_set, remember=writer, speculative_target="augmented") as c:
            result = c.generate(PROMPTS[0], "speculative", **options)
            assert result.path in REMEMBERED_PATHS and len(result.token_ids) == 6     # the path alone would be
            assert writer.status(corpus_set).atoms == 0 and writer.failed == 0
        with client(server_url, corpus_set, remember=writer) as c:                  # the exact target is
            c.generate(PROMPTS[0], "speculative", **options)
            assert writer.status(corpus_set).atoms == 6
    finally:
        writer.forget(corpus_set)
        writer.close()


def test_cli_speculative_with_the_augmented_target(capsys, database_env, corpus_set, tiny_dir):
    args = ["generate", PROMPTS[1], "--temperature", "0", "--max-new-tokens", "8", "--ignore-eos", "--atom-set",
            corpus_set, "--model", str(tiny_dir), "--device", "cpu"]
    code, out, _ = run_cli(capsys, *args, "--path", "augmented", "--json")
    code2, out2, _ = run_cli(capsys, *args, "--path", "speculative", "--speculative-target", "augmented", "--json")
    assert code == code2 == 0
    assert json.loads(out2)["token_ids"] == json.loads(out)["token_ids"]
    assert json.loads(out2)["stats"]["target"] == "augmented"
    code, _, err = run_cli(capsys, *args, "--path", "speculative", "--speculative-target", "augmented")
    assert code == 0 and "(verified against the augmented path)" in err.splitlines()[-1]


@pytest.mark.parametrize("extra, message", [
    (["--path", "speculative", "--speculative-target", "store"], "--speculative-target must be exact or augmented"),
    (["--path", "augmented", "--speculative-target", "augmented"], "--speculative-target is for --path speculative"),
    (["--path", "speculative", "--speculative-target", "augmented", "--remember"],
     "--remember keeps only the exact model's words"),
])
def test_cli_refuses_a_bad_speculative_target_in_one_line(capsys, extra, message):
    code, out, err = run_cli(capsys, "generate", PROMPTS[0], *extra)
    assert code == 1 and not out
    assert message in err and len(err.strip().splitlines()) == 1


def test_speculative_with_the_augmented_target_over_http(http):
    body = {"prompt": PROMPTS[0], "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    augmented = http.post("/api/generate", json={**body, "path": "augmented"})
    speculative = http.post("/api/generate", json={**body, "path": "speculative", "speculative_target": "augmented"})
    plain = http.post("/api/generate", json={**body, "path": "speculative"})
    assert augmented.status_code == speculative.status_code == plain.status_code == 200, speculative.text
    assert speculative.json()["token_ids"] == augmented.json()["token_ids"]
    assert speculative.json()["stats"]["target"] == "augmented" and plain.json()["stats"]["target"] == "exact"
    events = sse(http, {**body, "path": "speculative", "speculative_target": "augmented", "details": True})
    result = next(data for event, data in events if event == "result")
    assert result["token_ids"] == augmented.json()["token_ids"] and result["stats"]["target"] == "augmented"


@pytest.mark.parametrize("endpoint, body", [
    ("/api/generate", {"path": "speculative", "speculative_target": "store"}),
    ("/api/generate/stream", {"path": "speculative", "speculative_target": 3}),
    ("/api/generate", {"path": "augmented", "speculative_target": "augmented"}),
    ("/api/generate", {"speculative_target": "exact"}),                          # the spatial path by default
    ("/api/next_token", {"path": "exact", "speculative_target": "augmented"}),
])
def test_a_bad_speculative_target_is_422_naming_the_field(http, endpoint, body):
    response = http.post(endpoint, json={"prompt": PROMPTS[0], **body})
    assert response.status_code == 422
    assert "speculative_target" in [d["field"] for d in response.json()["detail"]]


# -- bench --augmented ---------------------------------------------------------------------------------

def test_bench_measures_both_paths_on_one_runtime(server_url, corpus_set):
    from benchmarks.augmented import PATHS, TARGET_MS, markdown, measure

    with client(server_url, corpus_set) as c:
        row = measure(c, PROMPTS, max_new_tokens=4)
    assert row["runtime"] == "torch" and set(row["methods"]) == set(PATHS)
    for path in PATHS:
        assert row["methods"][path]["steps"] == 2 * 3 and row["methods"][path]["ms_per_token"] > 0
    assert 0 < row["methods"]["augmented"]["mean_weight"] < 1
    assert row["difference_ms"] == pytest.approx(row["methods"]["augmented"]["ms_per_token"]
                                                 - row["methods"]["exact"]["ms_per_token"])
    assert row["met"] == (row["difference_ms"] <= TARGET_MS)
    text = markdown({"atom_set": corpus_set, "prompts": 2, "max_new_tokens": 4, "runtimes": [row],
                     "machine": {"cpu": "x", "cores": 2, "load_average": [1.0, 1.0, 1.0]}}, "hartonomous bench --augmented")
    assert "`hartonomous bench --augmented`" in text and "| torch |" in text


def test_bench_refuses_an_unknown_runtime_in_one_line(capsys):
    code, _, err = run_cli(capsys, "bench", "--augmented", "--runtimes", "int8")
    assert code != 0 and "--runtimes takes torch, int4 and llama with --augmented" in err


# -- the playground ------------------------------------------------------------------------------------

def test_the_playground_tints_each_augmented_token_by_its_weight(reader_url, corpus_set):
    import os
    from pathlib import Path

    from browser import CHROMIUM, Browser
    from optional_parts import missing
    from server_helpers import live_app

    if not os.path.exists(CHROMIUM):
        missing("needs Debian's chromium (apt-get install chromium; scripts/install-system-deps.sh installs it)")
    settings = {"max_new_tokens": 8, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1,
                "seed": 3}
    artifact = Path(__file__).resolve().parent.parent / "test-artifacts" / "playground-augmented.png"
    server, _ = live_app(reader_url, corpus_set)
    with server as url, Browser() as browser:
        browser.navigate(url + "/")
        browser.wait_for(f"[...document.querySelectorAll('#atom_set option')].some(o => o.value === "
                         f"{json.dumps(corpus_set)})", "the atom set in the selector")
        fill = [f"document.getElementById('prompt').value = {json.dumps(PROMPTS[0])}",
                f"document.getElementById('atom_set').value = {json.dumps(corpus_set)}",
                "document.getElementById('use-spatial').checked = false",
                "document.getElementById('use-exact').checked = false",
                "document.getElementById('use-speculative').checked = false",
                "document.getElementById('use-augmented').checked = true"]
        fill += [f"document.getElementById('{k}').value = '{v}'" for k, v in settings.items()]
        browser.evaluate("; ".join(fill))
        browser.click("#generate")
        browser.wait_for("document.getElementById('pane-augmented').dataset.state === 'done'", "the augmented pane")
        shown = browser.evaluate("[...document.querySelectorAll('#pane-augmented .generated .tok-weight')]"
                                 ".map(s => [Number(s.dataset.weight), s.classList.contains('store-top')])")
        summary = browser.evaluate("document.querySelector('#pane-augmented .spec-stats').textContent")
        legend = browser.evaluate("document.querySelector('#pane-augmented .legend').textContent")
        hidden = browser.evaluate("document.getElementById('pane-augmented').hidden")
        artifact.parent.mkdir(exist_ok=True)
        browser.screenshot(artifact)
        with httpx.Client(base_url=url, timeout=60) as h:
            events = sse(h, {"prompt": PROMPTS[0], "atom_set": corpus_set, "path": "augmented", "details": True,
                             "top_n": 12, **settings})
    tokens = [d for e, d in events if e == "message" and d != "[DONE]" and "token_id" in d]
    assert not hidden and shown == [[t["weight"], t["store_top"]] for t in tokens]
    assert "λ" in legend and "store" in legend
    assert summary.startswith("mean λ") and f"over {len(tokens)} steps" in summary
