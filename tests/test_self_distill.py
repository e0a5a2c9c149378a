"""--self-distill: the exact model's own continuations become atoms (hartonomous/corpus/self_distill.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psycopg
import pytest
import torch

from hartonomous.errors import UserError
from hartonomous.corpus import self_distill as sd
from projection.atoms import continuation_atoms, context_atoms
from tiny_model import tiny_model

from test_build import corpus_file, one, options, run_build  # noqa: F401 - the module's corpus fixture


def greedy_continuation(model, prompt: np.ndarray, n: int) -> list[int]:
    """n argmax steps without a cache: the reference the batched `generate` must match."""
    ids = torch.as_tensor(prompt, dtype=torch.long)[None]
    out: list[int] = []
    for _ in range(n):
        token = int(model(ids).logits[0, -1].argmax())
        out.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


def test_the_model_writes_exactly_n_tokens_after_prompts_cut_from_the_training_text() -> None:
    model, _ = tiny_model(0)
    train = np.random.default_rng(0).integers(5, 200, 3000)
    n = sd.BATCH * sd.CONTINUATION_TOKENS + 500                     # one greedy batch, part of a sampled one
    got = sd.self_distill(model, train, n, seed=0, eos_token_ids=set())
    assert got.generated == n and got.cached_batches == 0
    windows = {tuple(train[i:i + sd.PROMPT_TOKENS]) for i in range(len(train) - sd.PROMPT_TOKENS + 1)}
    assert all(tuple(s[:sd.PROMPT_TOKENS]) in windows for s in got.sequences)
    assert got.greedy_sequences == sd.BATCH and got.sampled_sequences == len(got.sequences) - sd.BATCH
    first = got.sequences[0]                  # batch 0 is greedy: the model's own argmax path
    assert first[sd.PROMPT_TOKENS:].tolist() == greedy_continuation(model, first[:sd.PROMPT_TOKENS],
                                                                    sd.CONTINUATION_TOKENS)
    sampled = got.sequences[sd.BATCH]
    assert sampled[sd.PROMPT_TOKENS:].tolist() != greedy_continuation(model, sampled[:sd.PROMPT_TOKENS],
                                                                      sd.CONTINUATION_TOKENS)


def test_temperature_zero_makes_every_batch_greedy() -> None:
    model, _ = tiny_model(0)
    train = np.random.default_rng(0).integers(5, 200, 3000)
    n = sd.BATCH * sd.CONTINUATION_TOKENS + 100
    got = sd.self_distill(model, train, n, seed=0, eos_token_ids=set(), temperature=0.0)
    assert got.sampled_sequences == 0 and got.stats()["sample_temperature"] == 0.0
    second = got.sequences[sd.BATCH]                                 # the second batch: greedy too
    assert second[sd.PROMPT_TOKENS:].tolist() == greedy_continuation(model, second[:sd.PROMPT_TOKENS],
                                                                     len(second) - sd.PROMPT_TOKENS)


def test_a_continuation_ends_at_the_models_first_eos() -> None:
    assert sd._until_eos(np.array([4, 9, 2, 9, -1, -1]), {9}).tolist() == [4, 9]
    assert sd._until_eos(np.array([4, 5, -1]), {9}).tolist() == [4, 5]


def test_a_second_run_reads_the_cache_and_gives_the_same_text(tmp_path: Path) -> None:
    model, _ = tiny_model(0)
    train = np.random.default_rng(1).integers(5, 200, 2000)
    first = sd.self_distill(model, train, 700, seed=3, eos_token_ids=set(), cache_dir=tmp_path / "teacher")
    again = sd.self_distill(model, train, 700, seed=3, eos_token_ids=set(), cache_dir=tmp_path / "teacher")
    assert first.cached_batches == 0 and again.cached_batches == 1
    assert [s.tolist() for s in first.sequences] == [s.tolist() for s in again.sequences]
    other_seed = sd.self_distill(model, train, 700, seed=4, eos_token_ids=set(), cache_dir=tmp_path / "teacher")
    assert other_seed.cached_batches == 0


def test_too_little_training_text_for_a_prompt_is_a_user_error() -> None:
    model, _ = tiny_model(0)
    with pytest.raises(UserError, match="prompts of 32 tokens"):
        sd.self_distill(model, np.arange(10), 100, seed=0, eos_token_ids=set())


def test_continuation_atoms_are_the_positions_whose_next_token_the_model_wrote() -> None:
    positions = np.random.default_rng(0).normal(size=(50, 3))
    seqs = [np.array([1, 2, 3, 4, 5, 6]), np.array([7, 8, 9, 10])]
    every = context_atoms(seqs, None, positions, 3, 0.5, "corpus")
    cont = continuation_atoms(seqs, 3, positions, 3, 0.5)
    # prompt of 3: the atoms predicting tokens 4, 5, 6 and 10 (keys at positions 2.. of each sequence)
    assert cont.token_ids.tolist() == [4, 5, 6, 10]
    np.testing.assert_array_equal(cont.positions, every.positions[[2, 3, 4, 7]])


def test_bad_self_distill_options_are_refused_before_any_work(corpus_file: Path) -> None:  # noqa: F811
    for extra, message in (({"self_distill": -1}, "--self-distill must be >= 0"),
                           ({"self_distill_only": True}, "pass --self-distill N too"),
                           ({"self_distill": 100, "kind": "token"}, "pass --kind context"),
                           ({"self_distill": 100, "positions": "learned"}, "drop --self-distill"),
                           ({"self_distill": 100, "self_distill_temperature": -1}, "between 0 \\(all greedy\\) and 10")):
        with pytest.raises(UserError, match=message):
            options("bad", extra.pop("kind", "context"), corpus_file, **extra).check()


def test_a_self_distilled_set_holds_the_models_words(server_url: str, corpus_file: Path) -> None:  # noqa: F811
    plain = run_build(server_url, options("sd-plain", "context", corpus_file, target="corpus"))
    both = run_build(server_url, options("sd-both", "context", corpus_file, target="corpus", self_distill=400))
    alone = run_build(server_url, options("sd-alone", "context", corpus_file, target="corpus", self_distill=400,
                                          self_distill_only=True))
    record = both.stats.self_distill
    assert record["tokens"] == 400 and record["sequences"] >= 400 // sd.CONTINUATION_TOKENS
    assert alone.stats.self_distill["only"] is True and record["only"] is False
    assert alone.stats.atoms.before_merge == 400
    assert both.stats.atoms.before_merge == plain.stats.atoms.before_merge + 400
    assert both.atoms > plain.atoms and 0 < alone.atoms <= 400
    total = "SELECT sum(weight) FROM atoms WHERE atom_set_id = %s"
    assert one(server_url, total, alone.atom_set_id)[0] == pytest.approx(400)
    assert one(server_url, total, both.atom_set_id)[0] == pytest.approx(one(server_url, total, plain.atom_set_id)[0]
                                                                         + 400)
    assert "self_distill" in both.stage_seconds
    # each atom records where it came from: the corpus (0) or the model's own text (1); a merged atom
    # the source holding most of its weight
    by_source = "SELECT source, count(*) FROM atoms WHERE atom_set_id = %s GROUP BY source ORDER BY source"
    assert rows(server_url, by_source, plain.atom_set_id) == [(0, plain.atoms)]
    assert rows(server_url, by_source, alone.atom_set_id) == [(1, alone.atoms)]
    mixed = dict(rows(server_url, by_source, both.atom_set_id))
    assert set(mixed) == {0, 1} and mixed[1] == record["atoms"] and 0 < mixed[1] <= alone.atoms
    baselines_learn_the_same_continuations(server_url, plain, both, alone)


def rows(url: str, sql: str, *args) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchall()


def baselines_learn_the_same_continuations(server_url: str, plain, both, alone) -> None:
    """`compare`'s counting baselines get the continuations the atoms hold (generated again from the
    recorded training text and seed: the same tokens), the same information as the spatial path."""
    from hartonomous.atomset import load_atom_set
    from hartonomous.compare.baselines import build_tokens, counting_baselines, recorded_corpus
    from hartonomous.corpus.sources import tokenize
    from test_compare_baselines import Stages

    model, tokenizer = tiny_model(0)
    learned = {}
    with psycopg.connect(server_url) as conn:
        infos = {r.name: load_atom_set(conn, r.name) for r in (plain, both, alone)}
    for name, info in infos.items():
        learned[name] = counting_baselines(info, model, tokenizer, recorded_corpus, None, None, Stages())
    info = infos[alone.name]
    train_ids = tokenize(tokenizer, recorded_corpus(info).text)[0][:build_tokens(info)]
    record = info.stats.self_distill
    again = sd.self_distill(model, train_ids, record["tokens"], seed=record["seed"],
                            eos_token_ids=set(record["eos_token_ids"]))
    rows = sum(len(s) - 1 for s in again.sequences)
    plain_d, both_d, alone_d = (learned[r.name][1] for r in (plain, both, alone))
    assert alone_d.tokens == sum(map(len, again.sequences)) and alone_d.positions == rows
    assert both_d.tokens == plain_d.tokens + alone_d.tokens and both_d.positions == plain_d.positions + rows
    assert "400 self-distilled tokens" in both_d.note and "alone" in alone_d.note
    infinigram = learned[alone.name][0]["∞-gram"]
    seq = again.sequences[0]
    t = sd.PROMPT_TOKENS + 5                        # a context inside the first continuation
    assert int(seq[t]) in infinigram(seq[:t].tolist()).ids.tolist()
