"""The counting baselines: the ∞-gram and the n-grams by hand on toy corpora, the suffix array against
a naive scan, the atom set's own labels (soft, argmax, corpus) and text (name and version, or files
with their sha256), and the cache mixtures fitted on the calibration half only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hartonomous.compare.infinigram import InfiniGram, suffix_array
from hartonomous.compare.labels import from_corpus, from_sequences, from_soft, label
from hartonomous.compare.ngram import ngrams


def as_dict(dist) -> dict[int, float]:
    return dict(zip(dist.ids.tolist(), dist.probs.tolist()))


# --- the ∞-gram by hand --------------------------------------------------------------------
#
# Two chunks with their own next tokens as labels (corpus labels), at every position but the last:
#   A = 1 2 3 1 2 4    labels after 1 | 2 | 3 | 1 | 2   : 2, 3, 1, 2, 4   (after the final 4: none)
#   B = 2 3 1 2 3      labels after 2 | 3 | 1 | 2       : 3, 1, 2, 3      (after the final 3: none)
TOY = [[1, 2, 3, 1, 2, 4], [2, 3, 1, 2, 3]]
WHOLE = {1: 2 / 9, 2: 3 / 9, 3: 3 / 9, 4: 1 / 9}          # all 9 labels


@pytest.fixture(scope="module")
def toy() -> InfiniGram:
    return InfiniGram(from_corpus(TOY))


def test_the_longest_suffix_answers_with_the_labels_that_followed_it(toy):
    # "3 1 2" ends at A[4] (then 4) and B[3] (then 3): one each
    match = toy.match([3, 1, 2])
    assert (match.length, match.occurrences) == (3, 2)
    assert as_dict(match.dist) == pytest.approx({3: 0.5, 4: 0.5})


def test_counts_add_up_over_every_occurrence(toy):
    # "1 2" ends at A[1] (then 3), A[4] (then 4), B[3] (then 3)
    match = toy.match([1, 2])
    assert (match.length, match.occurrences) == (2, 3)
    assert as_dict(match.dist) == pytest.approx({3: 2 / 3, 4: 1 / 3})


def test_an_unseen_long_suffix_backs_off_to_the_longest_seen_one(toy):
    # "5 1 2" never occurs; "1 2" does
    match = toy.match([5, 1, 2])
    assert match.length == 2 and as_dict(match.dist) == pytest.approx({3: 2 / 3, 4: 1 / 3})


def test_a_match_never_crosses_a_chunk_start(toy):
    # joined, A's last 4 is followed by B's first 2, but "4 2" was never one context: back off to "2"
    # (ends at A[1] -> 3, A[4] -> 4, B[0] -> 3, B[3] -> 3)
    match = toy.match([4, 2])
    assert match.length == 1 and as_dict(match.dist) == pytest.approx({3: 0.75, 4: 0.25})


def test_an_occurrence_without_a_label_does_not_count(toy):
    # "2 4" and "4" end only at A's last position, which has no label: the whole text's labels answer
    assert toy.match([2, 4]).length == 0
    assert as_dict(toy.predict([2, 4])) == pytest.approx(WHOLE)


def test_an_empty_context_or_an_unseen_token_gets_the_whole_texts_labels(toy):
    assert as_dict(toy.predict([])) == pytest.approx(WHOLE)
    assert as_dict(toy.predict([9])) == pytest.approx(WHOLE)
    assert toy.match([]).occurrences == 9


def test_soft_labels_add_their_probabilities():
    # "1" ends at position 0 of both chunks; their top-2 labels weigh 0.5 / 0.25 each
    chunks = [[1, 2], [1, 3]]
    labels = from_soft(chunks, [np.array([[5, 6], [0, 0]]), np.array([[6, 7], [0, 0]])],
                       [np.array([[0.5, 0.25], [0.5, 0.5]]), np.array([[0.5, 0.25], [0.5, 0.5]])])
    assert labels.describe() == "soft top-2" and labels.positions == 2      # the last rows are no atom
    assert as_dict(InfiniGram(labels).predict([1])) == pytest.approx({5: 0.5 / 1.5, 6: 0.75 / 1.5, 7: 0.25 / 1.5})


def test_the_ngrams_cap_the_suffix_and_count_soft_labels():
    """4-gram: "7 1 2" (chunk 1 only); trigram and bigram: "1 2" / "2" (both chunks); unigram: all
    labels. Label rows are t = 0..2 of each chunk; the last row (label 0) belongs to no atom."""
    chunks = [[7, 1, 2, 0], [8, 1, 2, 0]]
    ids = [np.array([[1, 9], [2, 9], [5, 6], [0, 0]]), np.array([[1, 9], [2, 9], [6, 5], [0, 0]])]
    probs = [np.array([[.9, .1], [.8, .1], [.6, .2], [.5, .5]]), np.array([[.9, .1], [.8, .1], [.7, .1], [.5, .5]])]
    index = InfiniGram(from_soft(chunks, ids, probs))
    models = ngrams(index)
    context = [9, 7, 1, 2]
    assert as_dict(models["4-gram"].predict(context)) == pytest.approx({5: 0.75, 6: 0.25})
    assert models["4-gram"].backoff_order(context) == 4
    both = {5: 0.7 / 1.6, 6: 0.9 / 1.6}
    assert as_dict(models["trigram"].predict(context)) == pytest.approx(both)
    assert as_dict(models["bigram"].predict(context)) == pytest.approx(both)
    total = 1.8 + 0.2 + 1.6 + 0.2 + 0.7 + 0.9
    assert as_dict(models["unigram"].predict(context)) == pytest.approx(
        {1: 1.8 / total, 2: 1.6 / total, 5: 0.7 / total, 6: 0.9 / total, 9: 0.4 / total})
    assert as_dict(index.predict(context)) == pytest.approx({5: 0.75, 6: 0.25})   # "9 7 1 2" never occurs


def test_hand_made_labels_may_cover_every_position():
    index = InfiniGram(from_sequences([[1, 2, 1]], [[5, 6, 7]]))     # the last position is labelled too
    assert as_dict(index.predict([2, 1])) == {7: 1.0}
    with pytest.raises(ValueError):
        from_sequences([[1, 2]], [[5, 6, 7]])


# --- the suffix array against a naive scan -------------------------------------------------

def naive_match(chunks: list[list[int]], context: list[int]) -> tuple[int, dict[int, int]]:
    """Longest suffix of `context` ending at a labelled position (t <= n - 2) of one chunk; its votes."""
    best: tuple[int, dict[int, int]] = (0, {})
    for length in range(len(context) + 1):
        votes: dict[int, int] = {}
        for chunk in chunks:
            for t in range(len(chunk) - 1):
                if t + 1 >= length and chunk[t + 1 - length:t + 1] == context[len(context) - length:]:
                    votes[chunk[t + 1]] = votes.get(chunk[t + 1], 0) + 1
        if not votes:
            break
        best = (length, votes)
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40))
def test_the_suffix_array_sorts_every_suffix(text):
    assert suffix_array(np.array(text, dtype=np.int64)).tolist() == sorted(range(len(text)), key=lambda i: text[i:])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=2, max_size=12), min_size=1, max_size=4),
       st.lists(st.lists(st.integers(0, 4), max_size=10), min_size=1, max_size=5))
def test_the_infinigram_agrees_with_a_naive_longest_match(chunks, contexts):
    index = InfiniGram(from_corpus(chunks))
    for context in contexts:
        length, votes = naive_match(chunks, context)
        total = sum(votes.values())
        match = index.match(context)
        assert (match.length, match.occurrences) == (length, total)
        assert as_dict(match.dist) == pytest.approx({token: n / total for token, n in votes.items()})
        for cap in (0, 1, 3):
            capped = naive_match(chunks, context[len(context) - min(cap, len(context)):])
            assert index.match(context, cap).length == capped[0]


# --- labels: corpus labels need no model; soft and argmax come from the teacher ------------------

def test_corpus_labels_run_no_model():
    labels, ran = label([np.array([3, 4, 5])], "corpus", None, model=None)
    assert ran is None and labels.ids[0].ravel().tolist() == [4, 5] and labels.describe() == "corpus"


def test_soft_labels_are_the_teachers_top_k_at_the_atom_positions(tmp_path):
    from hartonomous.corpus.teacher import teacher_force
    from tiny_model import tiny_model

    model, _ = tiny_model(0)
    chunks = [np.arange(10, 30), np.arange(40, 52)]
    labels, ran = label(chunks, "soft", 3, model, cache_dir=tmp_path)
    forced = teacher_force(model, chunks, top_k=3)
    assert [i.tolist() for i in labels.ids] == [i[:-1].tolist() for i in forced.top_ids]
    assert ran.tokens == 32 and ran.cached_tokens == 0
    again, ran = label(chunks, "soft", 3, model, cache_dir=tmp_path)    # the label cache answers
    assert ran.cached_tokens == 32 and all(np.array_equal(a, b) for a, b in zip(again.mass, labels.mass))
    argmax, _ = label(chunks, "argmax", None, model, cache_dir=tmp_path)
    assert [i.ravel().tolist() for i in argmax.ids] == [a[:-1].tolist() for a in forced.argmax]


# --- the set's own text, from where it records it came from ------------------------------------

def in_memory_set(stats: dict, kind: str = "context"):
    from hartonomous.atomset import AtomSet, BuildStats

    return AtomSet(id=1, name="s", model="tiny", model_key=None, kind=kind, vocab_size=320, embedding_dim=32,
                   projection="random", projection_params={}, centroid_window=None, centroid_decay=1.0,
                   kernel="gaussian", bandwidth=1.0, history_weight=0.0, history_window=512, is_default=False,
                   created_at=None, stats=BuildStats.from_json(stats), atoms=320)


class Stages:
    """progress.Progress that remembers the stages it was told about."""

    def __init__(self):
        self.names: list[str] = []

    def stage(self, description: str, total: int) -> None:
        self.names.append(description)

    def advance(self, n: int = 1) -> None:
        pass


@pytest.fixture()
def recorded_file_set(tmp_path):
    """A corpus-labelled set recording its corpus file by path and sha256, as a build does."""
    from hartonomous.corpus.sources import load_corpus
    from hartonomous.corpus.origin import origin_stats

    doc = tmp_path / "doc.txt"
    doc.write_text("\n\n".join(f"Paragraph {i}: the value of item {i % 7} is {i % 5}." for i in range(60)),
                   encoding="utf-8")
    corpus = load_corpus([doc], 400, 300, 3, train=True)
    stats = {"corpus": {"source": "doc.txt", **origin_stats([doc], corpus), "max_tokens": 400, "holdout_chars": 300,
                        "seed": 3, "context_length": 32},
             "holdout": {"source": "doc.txt holdout", "text": corpus.holdout_text},
             "distill": {"target": "corpus"}}
    return in_memory_set(stats), doc, corpus


def test_corpus_labels_need_no_teacher_pass(recorded_file_set, monkeypatch):
    """A corpus-labelled set's baselines learn the text's own next tokens: the model never runs."""
    from hartonomous.corpus import teacher
    from hartonomous.compare.baselines import counting_baselines, recorded_corpus
    from hartonomous.corpus.sources import chunk_ids, tokenize
    from tiny_model import tiny_model

    def refuse(*args, **kwargs):
        raise AssertionError("a teacher pass for corpus labels")

    monkeypatch.setattr(teacher, "teacher_force", refuse)
    info, doc, corpus = recorded_file_set
    model, tokenizer = tiny_model(0)
    stages = Stages()
    predictors, distill = counting_baselines(info, model, tokenizer, recorded_corpus, None, None, stages)
    assert distill.available and distill.teacher_pass is None and distill.labels == "corpus"
    assert distill.origin == {"kind": "files", "name": None, "version": None,
                              "files": [{"path": str(doc.resolve()), "sha256": info.stats.corpus.sha256[0]}]}
    chunks = chunk_ids(tokenize(tokenizer, corpus.train_text, 400)[0], 32)
    assert distill.tokens == sum(map(len, chunks)) and distill.positions == sum(len(c) - 1 for c in chunks)
    assert not any("labels" in name for name in stages.names)
    # the ∞-gram on the first chunk's own prefix answers with the corpus's next token there
    first = chunks[0]
    assert predictors["∞-gram"](first[:20].tolist()).ids.tolist().count(int(first[20])) == 1


def test_a_changed_corpus_file_is_refused_with_the_reason(recorded_file_set):
    from hartonomous.compare.baselines import counting_baselines, recorded_corpus
    from hartonomous.corpus.origin import CorpusUnavailable
    from tiny_model import tiny_model

    info, doc, _ = recorded_file_set
    doc.write_text(doc.read_text(encoding="utf-8") + "\n\nOne more paragraph.", encoding="utf-8")
    with pytest.raises(CorpusUnavailable, match=r"doc.txt changed since the build \(sha256 [0-9a-f]{12}"):
        recorded_corpus(info)
    model, tokenizer = tiny_model(0)
    predictors, distill = counting_baselines(info, model, tokenizer, recorded_corpus, None, None, Stages())
    assert predictors == {} and not distill.available
    assert "changed since the build" in distill.note and "counting baselines were skipped" in distill.note
    doc.unlink()
    with pytest.raises(CorpusUnavailable, match="is not there any more"):
        recorded_corpus(info)


def test_the_builtin_corpus_is_named_with_its_version_and_checked_by_its_sha256(monkeypatch):
    """A set built from the stdlib docstrings of another Python is refused unless the training text's
    sha256 confirms the rebuilt text; the record names the corpus and the version."""
    from hartonomous.corpus import sources as corpus_mod
    from hartonomous.corpus.sources import BUILTIN_CORPUS, builtin_version
    from hartonomous.corpus.origin import CorpusUnavailable, origin_stats, recorded_training_text, sha256_text

    record = origin_stats([], None)
    assert (record["name"], record["version"], record["files"]) == (BUILTIN_CORPUS, builtin_version(), [])
    entry = in_memory_set({"corpus": {"name": BUILTIN_CORPUS, "version": "Python 2.7.18", "max_tokens": 100,
                                      "seed": 0}}).stats.corpus
    with pytest.raises(CorpusUnavailable, match="Python 2.7.18's stdlib docstrings"):
        recorded_training_text(entry, None)
    docs = [corpus_mod.Document(f"m{i}", f"Docstring number {i} says what function {i} does.") for i in range(40)]
    monkeypatch.setattr(corpus_mod, "stdlib_documents", lambda: docs)
    rebuilt = corpus_mod.load_corpus(None, 100, None, 0)
    confirmed = entry.model_copy(update={"train_sha256": sha256_text(rebuilt.train_text)})
    text = recorded_training_text(confirmed, rebuilt.holdout_text)
    assert text.text == rebuilt.train_text and text.origin == {"kind": "builtin", "name": BUILTIN_CORPUS,
                                                               "version": "Python 2.7.18", "files": []}
    wrong = entry.model_copy(update={"train_sha256": "0" * 64})
    with pytest.raises(CorpusUnavailable, match="differs from the build's"):
        recorded_training_text(wrong, None)


# --- a built soft set, end to end ----------------------------------------------------------------

from test_build import corpus_file, options, run_build  # noqa: E402, F401 (corpus_file is a fixture)

SOFT_SET = "tiny-baselines"


@pytest.fixture(scope="module")
def soft_build(server_url, corpus_file, tmp_path_factory):  # noqa: F811
    """A soft top-4 context set, its teacher labels left in a label cache."""
    import psycopg

    from hartonomous.atomset import drop_atom_set

    cache = tmp_path_factory.mktemp("teacher")
    built = run_build(server_url, options(SOFT_SET, "context", corpus_file, soft_k=4, teacher_cache=cache,
                                          replace=True))
    yield built, cache
    with psycopg.connect(server_url) as conn:
        drop_atom_set(conn, SOFT_SET)


def load(server_url: str, name: str):
    import psycopg

    from hartonomous.atomset import load_atom_set

    with psycopg.connect(server_url) as conn:
        return load_atom_set(conn, name)


def test_a_soft_sets_baselines_count_exactly_its_atoms_labels(server_url, soft_build):
    """The labels come from the build's teacher-label cache (no model runs), and the unigram is the
    atoms' own label histogram: every token's total atom weight, normalised."""
    import psycopg

    from hartonomous.compare.baselines import counting_baselines, recorded_corpus
    from tiny_model import tiny_model

    built, cache = soft_build
    info = load(server_url, SOFT_SET)
    assert info.stats.corpus.text is None and info.stats.distill.soft_k == 4
    model, tokenizer = tiny_model(0)
    predictors, distill = counting_baselines(info, model, tokenizer, recorded_corpus, None, cache, Stages())
    assert (distill.labels, distill.target, distill.tokens) == ("soft top-4", "soft", info.stats.corpus.train_tokens)
    assert distill.teacher_pass["cached_tokens"] == distill.teacher_pass["tokens"] == distill.tokens
    with psycopg.connect(server_url) as conn:
        weights = dict(conn.execute("SELECT token_id, sum(weight) FROM atoms WHERE atom_set_id = %s GROUP BY token_id",
                                    (info.id,)).fetchall())
    total = sum(weights.values())
    assert as_dict(predictors["unigram"]([])) == pytest.approx({t: w / total for t, w in weights.items()}, rel=1e-5)
    assert distill.positions == info.stats.atoms.before_merge // 4


def greedy_text(model, tokenizer, steps: int = 80) -> str:
    """The exact model's own greedy continuation: there the next token is the argmax, and a tiny random
    model soon repeats itself, so the in-context cache predicts it well."""
    import torch

    ids = tokenizer("The capital", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return tokenizer.decode(ids)


def test_the_report_names_the_labels_and_fits_each_cache_on_the_calibration_half_only(server_url, soft_build,
                                                                                       tmp_path):
    """Scored text on which the cache would win (the model's own greedy loop) leaves the mixtures as
    fitted on the calibration half; the report says which labels and text the baselines used."""
    import psycopg

    from hartonomous.corpus import teacher
    from hartonomous.compare import CompareOptions, baselines, run_compare, write_report
    from hartonomous.compare.atomset import calibration_text
    from hartonomous.compare.runner import encode
    from hartonomous.compare.schema import validate_report
    from tiny_model import tiny_model

    _, cache = soft_build
    model, tokenizer = tiny_model(0)
    scored = tmp_path / "loop.txt"
    scored.write_text(greedy_text(model, tokenizer), encoding="utf-8")
    options_ = CompareOptions(atom_set=SOFT_SET, texts=[scored], max_positions=40, generation=False, query_samples=2,
                              max_neighbors=20, cache_dir=cache)
    with psycopg.connect(server_url, autocommit=True) as conn:
        result = run_compare(conn, options_, model=model, tokenizer=tokenizer, model_name="tiny")
    report = result.report
    validate_report(report)
    base = report["baselines"]
    assert {"∞-gram", "∞-gram + cache", "4-gram + cache", "4-gram"} <= set(base["paths"])
    d = base["distillation"]
    assert (d["labels"], d["origin"]["kind"]) == ("soft top-4", "files")
    assert d["teacher_pass"]["cached_tokens"] == d["tokens"]

    info = load(server_url, SOFT_SET)
    predictors, _ = baselines.counting_baselines(info, model, tokenizer, baselines.recorded_corpus, None, cache,
                                                 Stages())
    chunk, vocab = report["texts"][0]["tokens_used"], int(model.config.vocab_size)
    cal = encode(tokenizer, calibration_text(info).text)[:baselines.CALIBRATION_MAX_TOKENS]
    loop = encode(tokenizer, scored.read_text(encoding="utf-8"))[:chunk]
    for key, path in (("cache", "4-gram"), ("infinigram_cache", "∞-gram")):
        _, on_calibration = baselines.cache_mixture(predictors[path], (cal, teacher.argmax_labels(model, cal, chunk)),
                                                    chunk, vocab, path)
        _, on_scored = baselines.cache_mixture(predictors[path], (loop, teacher.argmax_labels(model, loop, chunk)),
                                               chunk, vocab, path)
        assert (on_scored.lam, on_scored.min_suffix) != (on_calibration.lam, on_calibration.min_suffix)
        section = base[key]
        assert section["base"] == path and section["fitted_on"] == "calibration"
        assert (section["lambda"], section["min_suffix"]) == (on_calibration.lam, on_calibration.min_suffix)
        assert len(section["grid"]) == len(on_calibration.grid)
        assert all(ours == pytest.approx(theirs) for ours, theirs in zip(section["grid"], on_calibration.grid))

    markdown = write_report(report, result.figures, tmp_path / "report")["md"].read_text(encoding="utf-8")
    assert "labels soft top-4 (the atom set's own)" in markdown and "∞-gram + cache: the ∞-gram mixed" in markdown
    assert f"sha256 {info.stats.corpus.sha256[0][:12]}" in markdown


# --- the full-dimensional KNN baseline ----------------------------------------------------------

def test_the_knn_baseline_breaks_distance_ties_by_atom_id(conn) -> None:
    """A soft-labelled position's atoms share one key, so K often cuts inside a tie: the lowest atom
    ids win, whatever order the scan returns them in (two identical sets must score the same)."""
    from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
    from hartonomous.compare.spatial import knn_distribution

    vocab, tied = 10, 6
    spec = AtomSetSpec(name="knn-ties", model="test", vocab_size=vocab, embedding_dim=3, projection="hand-made",
                       kind="context", kernel="gaussian", bandwidth=1.0, centroid_window=3, centroid_decay=0.01)
    tokens = TokenRows(np.arange(vocab), [None] * vocab, np.random.default_rng(0).random((vocab, 3)))
    keys = np.zeros((tied, 3), dtype=np.float32)                    # six atoms at one key: all tied
    atoms = AtomRows(np.arange(tied), np.zeros((tied, 3)), np.ones(tied), keys)
    set_id = write_atom_set(conn, spec, tokens, atoms).atom_set_id
    ids = [r[0] for r in conn.execute("SELECT atom_id FROM atoms WHERE atom_set_id = %s ORDER BY atom_id",
                                      (set_id,)).fetchall()]
    lowest = {t for (t,) in conn.execute("SELECT token_id FROM atoms WHERE atom_set_id = %s AND atom_id = ANY(%s)",
                                         (set_id, ids[:3])).fetchall()}
    conn.execute("UPDATE atoms SET weight = weight WHERE atom_set_id = %s AND atom_id = ANY(%s)",
                 (set_id, ids[:3]))                              # the lowest ids now sit last in the heap
    dist, _ = knn_distribution(conn, np.array([1.0, 0.0, 0.0]), set_id, k=3, bandwidth=1.0)
    assert set(dist.ids.tolist()) == lowest
