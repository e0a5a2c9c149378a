"""Where a drafted token came from: atoms record their source, and SQL `draft_sources` names the
source of the candidate that voted for each token most, as a NumPy reference over the same
candidates does; the speculative path streams it for kept drafts when asked.

The reference reuses tests/reference_next_token.py's candidates (next_token items 2-4); the memory
is folded in as more atoms (ht_knn rule 4: the nearest of both), so it is checked too.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hand_sets import add_set, random_set
from hartonomous import kernel
from hartonomous.atomset import ATOM_SOURCES, AtomRows
from hartonomous.errors import UserError
from projection.atoms import concat_atoms, merge_atoms
from reference_next_token import AtomSetData, reference_candidates

MEMORY = len(ATOM_SOURCES)            # the reference's code for a memory atom
NAMES = (*ATOM_SOURCES, "memory")
SOURCES_SQL = ("SELECT step, token_id, source FROM draft_sources(%s, %s, search_radius => %s, max_neighbors => %s, "
               "atom_set => %s, history_weight => %s, memory => %s) ORDER BY step")


# -- the codes, and how atoms carry them through the build ---------------------------------------

def test_sql_names_every_source_code_as_python_does(conn) -> None:
    for code, name in enumerate(ATOM_SOURCES):
        assert conn.execute("SELECT ht_atom_source(%s::smallint)", (code,)).fetchone()[0] == name
    assert conn.execute("SELECT ht_atom_source(%s::smallint)", (len(ATOM_SOURCES),)).fetchone()[0] is None
    (check,) = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                            "WHERE conname = 'atoms_source_check' AND conrelid = 'atoms'::regclass").fetchone()
    assert check == f"CHECK ((source = ANY (ARRAY[{', '.join(str(c) for c in range(len(ATOM_SOURCES)))}])))"


def test_a_merged_atom_takes_the_source_holding_most_of_its_weight() -> None:
    at = np.array([[0.5, 0.5, 0.5]] * 5 + [[0.1, 0.2, 0.3]] * 2)
    corpus = AtomRows(np.array([3, 3, 4, 4, 4]), at[:5], np.array([1.0, 1.0, 2.0, 0.5, 0.5]))
    distilled = AtomRows(np.array([3, 4]), at[:2], np.array([2.5, 1.0]),
                         sources=np.array([1, 1], dtype=np.int16))
    both = concat_atoms([corpus, distilled])
    assert both.sources.tolist() == [0, 0, 0, 0, 0, 1, 1]          # a part without sources is the corpus's
    merged = merge_atoms(both, 0.0)
    by_token = dict(zip(merged.token_ids.tolist(), zip(merged.sources.tolist(), merged.weights.tolist())))
    assert by_token == {3: (1, 4.5), 4: (0, 4.0)}                   # 2.5 of 4.5 self-distilled; 3 of 4 corpus
    tied = merge_atoms(AtomRows(np.array([7, 7]), np.zeros((2, 3)), np.array([1.0, 1.0]),
                                sources=np.array([1, 0], dtype=np.int16)), 0.0)
    assert tied.sources.tolist() == [0]                             # a tie goes to the corpus
    assert concat_atoms([corpus, corpus]).sources is None           # no part records sources: none recorded


def test_the_writer_refuses_unknown_source_codes(server_url) -> None:
    s = replace(random_set("sources_bad", 1), atom_sources=np.full(600, len(ATOM_SOURCES), dtype=np.int16))
    with psycopg.connect(server_url) as db, pytest.raises(UserError, match="atom sources must be one code per atom"):
        add_set(db, s)


# -- draft_sources against the reference ------------------------------------------------------

@pytest.fixture(scope="module")
def sourced(server_url) -> AtomSetData:
    """600 random atoms, about half of them self-distilled; history atoms on (weight 2)."""
    rng = np.random.default_rng(5)
    s = replace(random_set("sources_random", 3), bandwidth=0.25, window=3, decay=0.7, history_weight=2.0, history_window=64,
                atom_sources=rng.integers(0, 2, 600).astype(np.int16))
    with psycopg.connect(server_url) as db:
        add_set(db, s)
    with psycopg.connect(server_url, autocommit=True) as owner:    # a memory of two generations
        owner.execute("SELECT forget(%s)", (s.name,))
        for context, generated in (([1, 2, 3], [7, 8, 9, 10, 11, 12]), ([4, 5], [20, 21, 22, 23])):
            owner.execute("SELECT remember(%s, %s, %s, 'exact', weight => 3, temperature => 0)", (s.name, context, generated))
    return s


def with_memory(conn, s: AtomSetData) -> AtomSetData:
    """The set's atoms and its memory as one reference set (memory atoms carry code MEMORY)."""
    rows = conn.execute("SELECT m.token_id, m.weight, ST_X(m.position), ST_Y(m.position), ST_Z(m.position) "
                        "FROM memory_atoms m JOIN atom_sets a ON a.id = m.atom_set_id WHERE a.name = %s",
                        (s.name,)).fetchall()
    arr = np.array(rows, dtype=np.float64)
    return replace(s, atom_tokens=np.concatenate([s.atom_tokens, arr[:, 0].astype(np.int64)]),
                   atom_weights=np.concatenate([s.atom_weights, arr[:, 1]]),
                   atom_positions=np.concatenate([s.atom_positions, arr[:, 2:]]),
                   atom_sources=np.concatenate([s.atom_sources, np.full(len(arr), MEMORY, dtype=np.int16)]))


def reference_sources(s: AtomSetData, context: list[int], tokens: list[int], search_radius, max_neighbors,
                      history_weight) -> tuple[list[str | None], bool]:
    """(the source per token, whether some pick was within 1e-9 of a runner-up of another source)."""
    out, close = [], False
    for i, token in enumerate(tokens):
        cand = reference_candidates(s, context + tokens[:i], search_radius, max_neighbors, history_weight)
        radius = kernel.backoff_radius(cand.distances.min(), s.bandwidth, s.decay) if s.kernel == "backoff" else None
        terms = kernel.log_contributions(cand.distances, cand.weights, s.kernel, s.bandwidth, radius=radius)
        rank = np.where(cand.index < 0, MEMORY + 1, s.atom_sources[np.maximum(cand.index, 0)])
        voters = np.flatnonzero((cand.tokens == token) & np.isfinite(terms))
        if len(voters) == 0:
            out.append(None)
            continue
        order = voters[np.lexsort((rank[voters], cand.distances[voters], -terms[voters]))]
        best = order[0]
        others = [j for j in order[1:] if rank[j] != rank[best]]
        close |= bool(others and terms[best] - terms[others[0]] < 1e-9)
        out.append("context" if cand.index[best] < 0 else NAMES[rank[best]])
    return out, close


@pytest.mark.parametrize("memory", [False, True])
@pytest.mark.parametrize("search_radius, history_weight", [(None, None), (None, 0.0), (0.35, None)])
def test_draft_sources_names_the_candidate_that_voted_most(conn, sourced, memory, search_radius, history_weight):
    s = with_memory(conn, sourced) if memory else sourced
    rng = np.random.default_rng(17)
    seen, decided = set(), 0
    for trial in range(25):
        context = rng.integers(0, s.vocab_size, rng.integers(1, 10)).tolist()
        if trial < 4:                      # the remembered prompts: their continuations lie at distance 0
            context = [[1, 2, 3], [4, 5]][trial % 2] + ([7, 8] if trial == 2 else [])
        drafted = [t for (t,) in conn.execute(
            "SELECT token_id FROM draft_tokens(%s, 3, temperature => 0, search_radius => %s, max_neighbors => 30, "
            "atom_set => %s, history_weight => %s, memory => %s)",
            (context, search_radius, s.name, history_weight, memory)).fetchall()]
        tokens = drafted + [int(rng.integers(0, s.vocab_size))]       # and one the drafter may not propose
        got = conn.execute(SOURCES_SQL, (context, tokens, search_radius, 30, s.name, history_weight, memory)).fetchall()
        assert [(step, token) for step, token, _ in got] == list(enumerate(tokens))
        want, close = reference_sources(s, context, tokens, search_radius, 30, history_weight)
        if close:
            continue
        decided += 1
        assert [source for _, _, source in got] == want, (context, tokens)
        assert all(source is not None for _, _, source in got[:len(drafted)])   # a drafted token had a voter
        seen |= set(want)
    assert decided >= 20
    assert {"corpus", "self-distilled"} <= seen
    assert ("memory" in seen) == memory and ("context" in seen) == (history_weight != 0.0)


@pytest.mark.parametrize("arguments, message", [
    (dict(tokens=[]), "tokens must be a non-empty array"),
    (dict(tokens=[1, None]), "tokens must not contain NULL"),
    (dict(tokens=[1] * 65), "tokens must be between 1 and 64"),
    (dict(tokens=[1, 999]), "tokens: token id 999 \\(element 2\\) is not in atom set"),
    (dict(context=[]), "context must be a non-empty array"),
    (dict(context=[999]), "context: token id 999 \\(element 1\\)"),
    (dict(max_neighbors=0), "max_neighbors"),
    (dict(search_radius=-1.0), "search_radius"),
    (dict(memory=None), "memory must be true or false"),
    (dict(atom_set="no such set"), "atom_set: no atom set named"),
])
def test_bad_input_names_the_argument(conn, sourced, arguments, message):
    args = dict(context=[1, 2], tokens=[3], search_radius=None, max_neighbors=30, atom_set=sourced.name,
                history_weight=None, memory=False)
    args.update(arguments)
    conn.execute("SAVEPOINT bad")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute(SOURCES_SQL, tuple(args.values()))
    conn.execute("ROLLBACK TO SAVEPOINT bad")


# -- any input: one row per token, or 22023 naming a bad argument --------------------------------

TOKEN = st.integers(0, 49)
BAD = {
    "context": st.one_of(st.just([]), st.lists(st.one_of(st.none(), TOKEN), min_size=1, max_size=4)
                         .filter(lambda c: None in c), st.lists(st.integers(50, 2**31 - 1), min_size=1, max_size=2)),
    "tokens": st.one_of(st.just([]), st.just([None]), st.lists(TOKEN, min_size=65, max_size=66),
                        st.lists(st.integers(50, 2**31 - 1), min_size=1, max_size=2)),
    "search_radius": st.sampled_from([-1.0, float("nan"), float("-inf")]),
    "max_neighbors": st.sampled_from([0, -5, 100_001]),
    "history_weight": st.sampled_from([-1.0, float("nan"), float("inf")]),
    "memory": st.none(),
}
GOOD = {
    "context": st.lists(TOKEN, min_size=1, max_size=12),
    "tokens": st.lists(TOKEN, min_size=1, max_size=6),
    "search_radius": st.one_of(st.none(), st.floats(0.05, 2.0)),
    "max_neighbors": st.integers(1, 200),
    "history_weight": st.one_of(st.none(), st.sampled_from([0.0, 0.5, 3.0])),
    "memory": st.booleans(),
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_input_gives_one_row_per_token_or_22023_naming_a_bad_argument(conn, sourced, data):
    bad = data.draw(st.sets(st.sampled_from(sorted(BAD)), max_size=2))
    args = {name: data.draw(BAD[name] if name in bad else GOOD[name]) for name in GOOD}
    conn.execute("SAVEPOINT fuzz")
    try:
        rows = conn.execute(SOURCES_SQL, (args["context"], args["tokens"], args["search_radius"],
                                          args["max_neighbors"], sourced.name, args["history_weight"],
                                          args["memory"])).fetchall()
    except psycopg.errors.InvalidParameterValue as exc:
        conn.execute("ROLLBACK TO SAVEPOINT fuzz")
        message = exc.diag.message_primary
        assert bad and any(message.startswith(name) for name in bad), (bad, message)
        return
    conn.execute("RELEASE SAVEPOINT fuzz")
    assert not bad, (bad, args)
    assert [(step, token) for step, token, _ in rows] == list(enumerate(args["tokens"]))
    assert {source for _, _, source in rows} <= {None, "corpus", "self-distilled", "memory", "context"}
