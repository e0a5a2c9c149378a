"""Speculative decoding with the augmented distribution as the target.

The store drafts; the exact model plus the store verify (one forward and one store_distribution
call per round). Greedy output is the augmented path's token for token, and sampled output has
the augmented path's distribution (chi-squared over seeded runs, as for the exact target).
"""

from __future__ import annotations

import uuid
from collections import Counter

import psycopg
import pytest
import torch

from generation_helpers import drop_atom_set
from hartonomous import sqlcalls
from hartonomous.atomset import load_atom_set
from hartonomous.augment.backend import AugmentedBackend
from hartonomous.augment.gate import FEATURES, Gate, feature_row
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.engine import Engine
from hartonomous.errors import UserError
from hartonomous.runtimes.reference import ExactModel
from hartonomous.generation_config import GenerationConfig, SamplerArgs
from hartonomous.sampling import logits_to_probs, process_logits
from hartonomous.speculative.decoding import SpeculativeBackend
from test_speculative import ALPHA, chi_squared_p_value
from tiny_model import TRAIN_TEXT, tiny_model

PROMPTS = ["The capital of France is", "def add(a, b):"]
GREEDY = GenerationConfig(max_new_tokens=24, temperature=0.0, stop_at_eos=False)
SAMPLER = SamplerArgs(temperature=1.3, top_k=4, top_p=1.0, repetition_penalty=1.2)
RUNS = 1200


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py


@pytest.fixture(scope="module")
def corpus_set(server_url, tmp_path_factory):
    """A context set of the tiny model's training text labelled by the text itself (corpus labels)."""
    from projection.build import BuildOptions, build

    model, tokenizer = tiny_model(0)
    corpus = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    corpus.write_text("\n".join(TRAIN_TEXT))
    name = f"tiny-corpus-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url) as conn:
        build(conn, BuildOptions(name=name, kind="context", model="tiny", corpus=[corpus], max_tokens=3000,
                                 landmarks=64, target="corpus"), model=model, tokenizer=tokenizer)
    yield name
    drop_atom_set(server_url, name)


def hand_gate(intercept: float, **coefficients: float) -> Gate:
    """A gate with unit scales: λ = σ(intercept + Σ c_f · feature_f)."""
    return Gate(FEATURES, (0.0,) * len(FEATURES), (1.0,) * len(FEATURES),
                tuple(coefficients.get(f, 0.0) for f in FEATURES), intercept, 0.0, 0.0, 1)


GATES = {"half": hand_gate(0.0), "by-features": hand_gate(-1.0, store_top=2.0, agree=1.5, exact_top=-1.0)}


def augmented(conn, name: str, gate: Gate) -> AugmentedBackend:
    model, tokenizer = tiny_model(0)
    return AugmentedBackend(ExactBackend(ExactModel(model, tokenizer)), conn, load_atom_set(conn, name), gate)


@pytest.fixture
def conn(server_url):
    with psycopg.connect(server_url, autocommit=True) as c:
        yield c


def spatial_drafter(conn, name: str) -> SpatialBackend:
    return SpatialBackend(conn, name, tokenizer=tiny_model(0)[1])


@pytest.mark.parametrize("gate", sorted(GATES))
@pytest.mark.parametrize("draft_tokens", [1, 4])
@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_greedy_output_is_the_augmented_paths_token_for_token(conn, corpus_set, gate, draft_tokens,
                                                               repetition_penalty):
    config = GREEDY.with_options(repetition_penalty=repetition_penalty)
    plain = Engine(augmented(conn, corpus_set, GATES[gate]))
    spec = Engine(SpeculativeBackend(augmented(conn, corpus_set, GATES[gate]), spatial_drafter(conn, corpus_set),
                                     draft_tokens=draft_tokens, max_draft_tokens=8))
    drafted = 0
    for prompt in PROMPTS:
        expected = plain.generate(prompt, config)
        got = spec.generate(prompt, config)
        assert got.token_ids == expected.token_ids
        drafted += got.stats.drafted
    assert drafted > 0


def augmented_joint(conn, name: str, gate: Gate, prompt_ids: list[int], sampler: SamplerArgs, length: int
                    ) -> dict[tuple[int, ...], float]:
    """P(first `length` tokens) of the augmented path, computed here from its definition: the exact
    model's logits and store_distribution's rows, each penalised, mixed by the gate's λ, then
    temperature and top-k."""
    model, tokenizer = tiny_model(0)
    exact = ExactModel(model, tokenizer)
    joint = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for prefix, mass in joint.items():
            ids = prompt_ids + list(prefix)
            logits = exact.full_logits(ids).to(torch.float64)
            step = sqlcalls.store_distribution(conn, ids, atom_set=name)[0]
            lam = gate.weight(feature_row(step, torch.softmax(logits, -1).numpy()))
            p_exact = torch.softmax(process_logits(logits, ids, repetition_penalty=sampler.repetition_penalty), -1)
            ln_store = torch.full_like(logits, -torch.inf)
            ln_store[step.token_ids] = torch.log(torch.tensor(step.probabilities, dtype=torch.float64))
            p_store = torch.softmax(process_logits(ln_store, ids, repetition_penalty=sampler.repetition_penalty), -1)
            probs = logits_to_probs(torch.log((1 - lam) * p_exact + lam * p_store), None,
                                    temperature=sampler.temperature, top_k=sampler.top_k, top_p=sampler.top_p)
            for token in torch.nonzero(probs).flatten().tolist():
                nxt[prefix + (token,)] = mass * float(probs[token])
        joint = nxt
    return joint


def test_sampled_output_has_the_augmented_paths_distribution(conn, corpus_set):
    gate = GATES["by-features"]
    backend = SpeculativeBackend(augmented(conn, corpus_set, gate), spatial_drafter(conn, corpus_set),
                                 draft_tokens=2, max_draft_tokens=2)
    engine = Engine(backend)
    prompt = PROMPTS[0]
    joint = augmented_joint(conn, corpus_set, gate, engine.encode(prompt), SAMPLER, 3)
    config = GenerationConfig(max_new_tokens=3, temperature=SAMPLER.temperature, top_k=SAMPLER.top_k,
                              top_p=SAMPLER.top_p, repetition_penalty=SAMPLER.repetition_penalty, stop_at_eos=False)
    counts, drafted, accepted = Counter(), 0, 0
    for seed in range(RUNS):
        result = engine.generate(prompt, config.with_options(seed=seed))
        counts[tuple(result.token_ids)] += 1
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert 0 < accepted < drafted
    assert chi_squared_p_value(counts, joint) > ALPHA


def test_the_augmented_joint_is_not_the_exact_one(conn, corpus_set):
    """Power: the store moves the distribution (else the test above could not tell the targets apart)."""
    from test_speculative import exact_joint

    ids = tiny_model(0)[1](PROMPTS[0], add_special_tokens=False)["input_ids"]
    a = augmented_joint(conn, corpus_set, GATES["by-features"], list(ids), SAMPLER, 2)
    e = exact_joint(list(ids), SAMPLER, 2)
    assert sum(abs(a.get(s, 0.0) - e.get(s, 0.0)) for s in set(a) | set(e)) > 0.05


def test_trees_are_refused_for_the_augmented_target(conn, corpus_set):
    with pytest.raises(UserError, match="chains only"):
        SpeculativeBackend(augmented(conn, corpus_set, GATES["half"]), spatial_drafter(conn, corpus_set),
                           max_tree_width=2)
