"""Property/fuzz suite for the SQL inference functions, run as the least-privilege reader role.

Any input to next_token, sample_next_token, generate_tokens and next_token_batch (random arrays,
empty and 10^6-long contexts, NULLs, NaN, +-Inf, extreme and negative values) either gives a
valid distribution / valid token ids, or raises SQLSTATE 22023 whose message starts with the
name of the first bad argument, in the order the functions check them. One connection stays
open for the whole module: had any call crashed a backend, PostgreSQL would have reset every
connection, and the final `SELECT 1` on it would fail.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st

from distribution_checks import check_distribution
from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, drop_atom_set, write_atom_set

VOCAB = 64
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
SAMPLER_MIN, SAMPLER_MAX = 1e-6, 1e6     # temperature (> 0) and repetition_penalty bounds
MAX_NEW_TOKENS = 4096                    # generate_tokens' bound (and GenerationConfig's)
HISTORY_WINDOW_MAX = 4096
HISTORY = "history_weight => %s::float8, history_window => %s::int"
NEXT_TOKEN = ("SELECT token_id, probability, cumulative_probability FROM next_token("
              f"%s::int[], %s::float8, %s::int, %s::float8, %s::float8, %s::int, %s::text, %s::float8, {HISTORY})")
SAMPLE = ("SELECT sample_next_token(%s::int[], %s::float8, %s::int, %s::float8, %s::float8, %s::int, %s::text, "
          f"%s::float8, %s::bigint, %s::int, {HISTORY})")
GENERATE = ("SELECT generate_tokens(%s::int[], %s::int, %s::float8, %s::int, %s::float8, %s::float8, %s::int, "
            f"%s::text, %s::float8, %s::bigint, %s::int[], {HISTORY})")
BATCH = ("SELECT context_index, token_id, probability, cumulative_probability FROM next_token_batch("
         f"%s::jsonb, %s::float8, %s::int, %s::float8, %s::float8, %s::int, %s::text, %s::float8, {HISTORY})")


@dataclass(frozen=True)
class FuzzSet:
    name: str
    tokens: frozenset[int]          # ids in the tokens table (valid context ids)
    atom_tokens: frozenset[int]     # ids of the stored atoms
    history_weight: float           # the set's own history settings (a NULL argument takes them)
    history_window: int

    def __repr__(self) -> str:      # short, for hypothesis' falsifying examples
        return f"FuzzSet({self.name!r})"

    def can_answer(self, context: list[int], history_weight: float | None = None,
                   history_window: int | None = None) -> frozenset[int]:
        """The ids a call on `context` may return: the stored atoms' tokens, and the tokens the
        context's history atoms vote for (sql/020_next_token.sql, step 4: with the weight in effect
        > 0, m = min(H, n - 1), the last m tokens of the context)."""
        weight = self.history_weight if history_weight is None else history_weight
        window = self.history_window if history_window is None else history_window
        m = min(window, len(context) - 1) if weight > 0 else 0
        return self.atom_tokens | frozenset(context[len(context) - m:]) if m > 0 else self.atom_tokens


def _write(url: str, name: str, seed: int, log_w: tuple[float, float], scale: float, **spec) -> None:
    rng = np.random.default_rng(seed)
    n_atoms = 600
    atom_tokens = np.concatenate([np.arange(VOCAB), rng.integers(0, VOCAB, n_atoms - VOCAB)])
    weights = np.exp(rng.uniform(*log_w, n_atoms))
    with psycopg.connect(url) as conn:
        write_atom_set(conn, AtomSetSpec(name=name, model="fuzz", vocab_size=VOCAB, embedding_dim=3,
                                         projection="hand-made", kind="token", **spec),
                       TokenRows(np.arange(VOCAB), [None] * VOCAB, rng.normal(size=(VOCAB, 3)) * scale),
                       AtomRows(atom_tokens, rng.normal(size=(n_atoms, 3)) * scale, weights), replace=True)


def _read_set(conn: psycopg.Connection, condition: str, params: tuple = ()) -> FuzzSet | None:
    """The atom set `condition` selects, as the oracle needs it (read back, so nothing is assumed)."""
    row = conn.execute(f"SELECT id, name, history_weight, history_window FROM atom_sets WHERE {condition}",
                       params).fetchone()
    if row is None:
        return None
    tokens = {r[0] for r in conn.execute("SELECT token_id FROM tokens WHERE atom_set_id = %s", (row[0],))}
    atoms = {r[0] for r in conn.execute("SELECT DISTINCT token_id FROM atoms WHERE atom_set_id = %s", (row[0],))}
    return FuzzSet(row[1], frozenset(tokens), frozenset(atoms), row[2], row[3])


@pytest.fixture(scope="module")
def sets(server_url: str) -> Iterator[dict[str, FuzzSet]]:
    """Three committed sets: ordinary; extreme weights with a short window; long decay, tiny coordinates.

    The last two have history atoms on by default (a NULL history argument takes the set's value).
    """
    _write(server_url, "fuzz_plain", 1, (-3, 3), 1.0, bandwidth=0.5)
    _write(server_url, "fuzz_wide", 2, (-740, 700), 1.0, kernel="exponential", bandwidth=0.05, centroid_window=4,
           centroid_decay=0.3)
    _write(server_url, "fuzz_decay", 3, (-1, 1), 0.01, bandwidth=0.003, centroid_decay=0.5)
    with psycopg.connect(server_url) as conn:
        conn.execute("UPDATE atom_sets SET history_weight = 1e300, history_window = 3 WHERE name = 'fuzz_wide'")
        conn.execute("UPDATE atom_sets SET history_weight = 2, history_window = 4096 WHERE name = 'fuzz_decay'")
        made = {key: _read_set(conn, "name = %s", (f"fuzz_{key}",)) for key in ("plain", "wide", "decay")}
    yield made
    with psycopg.connect(server_url) as conn:
        for s in made.values():
            drop_atom_set(conn, s.name)


@pytest.fixture(scope="module")
def db(reader_url: str, sets) -> Iterator[psycopg.Connection]:
    """The reader's connection for the whole module; it must survive every call."""
    with psycopg.connect(reader_url, autocommit=True) as conn:
        yield conn
        assert conn.execute("SELECT 1").fetchone() == (1,), "the database did not survive the fuzz calls"


def _default_set(db: psycopg.Connection) -> FuzzSet | None:
    """The set a NULL atom_set resolves to: whichever the session's database has as its default (another
    module's set, perhaps with history atoms, when one is left), else None."""
    return _read_set(db, "is_default")


def _resolve(db, sets: dict[str, FuzzSet], atom_set: str | None) -> FuzzSet | None:
    if atom_set is None:
        return _default_set(db)
    return next((s for s in sets.values() if s.name == atom_set), None)


# -- what must fail, and with which argument named --------------------------------------------------

def _context_error(context) -> bool:
    if context is None or len(context) == 0:
        return True
    if isinstance(context[0], list):          # a 2-D array
        return True
    return any(t is None for t in context)


def _sampler_error(temperature, top_k, top_p, search_radius, max_neighbors, repetition_penalty,
                   history_weight, history_window) -> str | None:
    def bounded_positive(x) -> bool:
        return x is not None and math.isfinite(x) and SAMPLER_MIN <= x <= SAMPLER_MAX

    if temperature is None or not (temperature == 0 or bounded_positive(temperature)):
        return "temperature"
    if top_k is not None and top_k < 0:
        return "top_k"
    if top_p is not None and (math.isnan(top_p) or not 0 < top_p <= 1):
        return "top_p"
    if search_radius is not None and (math.isnan(search_radius) or search_radius < 0):
        return "search_radius"
    if max_neighbors is None or not 1 <= max_neighbors <= 100_000:
        return "max_neighbors"
    if not bounded_positive(repetition_penalty):
        return "repetition_penalty"
    if history_weight is not None and not (math.isfinite(history_weight) and history_weight >= 0):
        return "history_weight"
    if history_window is not None and not 0 <= history_window <= HISTORY_WINDOW_MAX:
        return "history_window"
    return None


def _set_error(fs: FuzzSet | None, context) -> str | None:
    if fs is None:
        return "atom_set"
    if any(t not in fs.tokens for t in context):
        return "context"
    return None


def _call(db: psycopg.Connection, sql: str, params: tuple) -> tuple[list | None, psycopg.Error | None]:
    try:
        return db.execute(sql, params).fetchall(), None
    except psycopg.Error as exc:
        return None, exc


def _event(name: str) -> None:
    """Count outcomes for --hypothesis-show-statistics (only inside a hypothesis test)."""
    if currently_in_test_context():
        event(name)


def _assert_fails_naming(error: psycopg.Error | None, argument: str) -> None:
    _event(f"22023 {argument.split('[')[0]}")
    assert error is not None, f"expected SQLSTATE 22023 naming {argument}, got rows"
    assert error.sqlstate == "22023", f"{error.sqlstate}: {error.diag.message_primary}"
    assert error.diag.message_primary.startswith(argument), error.diag.message_primary


def _assert_succeeds(error: psycopg.Error | None) -> None:
    _event("valid result")
    assert error is None, f"{error.sqlstate}: {error.diag.message_primary}"


CANDIDATES = ("SELECT count(*) FROM next_token(%s::int[], 1.0, 0, 1.0, %s::float8, %s::int, %s::text, %s::float8, "
              f"{HISTORY}, memory => %s::boolean)")


def _candidates(db: psycopg.Connection, a: dict, context: list[int], search_radius: float | None,
                memory: bool = False) -> int:
    """How many tokens next_token offers after `context` with the call's atom set, neighbours, penalty and
    history, within `search_radius` (None: no radius), with every token kept (T = 1, no top-k or top-p)."""
    params = (context, search_radius, a["max_neighbors"], a["atom_set"], a["repetition_penalty"], *_history(a),
              memory)
    return db.execute(CANDIDATES, params).fetchone()[0]


def _assert_no_candidate_within_the_radius(db: psycopg.Connection, a: dict, context: list[int],
                                           memory: bool = False) -> None:
    """An answer that ends with nothing to offer: the search radius left no candidate after `context`,
    and without the radius the same call has some (so the radius, and nothing else, emptied it)."""
    _event("no candidate within the radius")
    assert a["search_radius"] is not None, "no candidate, yet no search radius"
    assert _candidates(db, a, context, a["search_radius"], memory) == 0, "a candidate within the radius"
    assert _candidates(db, a, context, None, memory) > 0, "no candidate even without the radius"


# -- strategies ---------------------------------------------------------------------------------------
# Each example fuzzes at most two arguments with anything (NULL, NaN, +-Inf, extremes, wrong shapes)
# and draws the others from their valid ranges, so that both outcomes are exercised often.

INT32 = st.integers(-2**31, 2**31 - 1)
INT64 = st.integers(-2**63, 2**63 - 1)
EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 5e-324, 1e-310, 1e-7, SAMPLER_MIN, 0.5, 2.0, SAMPLER_MAX, 1e7, 1e300,
               1.7e308, math.inf, -math.inf, math.nan]
ANY_FLOAT = st.one_of(st.none(), st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=True, allow_infinity=True),
                      st.floats(0.01, 5.0))
ANY_INT = st.one_of(st.none(), st.sampled_from([0, 1, -1, 100_000, 100_001, 2**31 - 1, -2**31]), INT32,
                    st.integers(-3, 300))
TOKEN = st.integers(0, VOCAB - 1)
ANY_TOKEN = st.one_of(TOKEN, INT32, st.integers(-5, VOCAB + 5))
SET_NAMES = ["fuzz_plain", "fuzz_wide", "fuzz_decay"]

VALID = {
    "context": st.lists(TOKEN, min_size=1, max_size=40),
    "temperature": st.one_of(st.sampled_from([0.0, SAMPLER_MIN, SAMPLER_MAX, 1.0]), st.floats(SAMPLER_MIN, 10.0)),
    "top_k": st.one_of(st.none(), st.integers(0, 100), st.sampled_from([2**31 - 1])),
    "top_p": st.one_of(st.none(), st.sampled_from([1.0, 5e-324]), st.floats(0, 1, exclude_min=True)),
    "search_radius": st.one_of(st.none(), st.none(), st.sampled_from([0.0, math.inf, 1e308]), st.floats(0, 3)),
    "max_neighbors": st.one_of(st.integers(1, 700), st.sampled_from([1, 100_000])),
    "repetition_penalty": st.one_of(st.just(1.0), st.sampled_from([SAMPLER_MIN, SAMPLER_MAX]),
                                    st.floats(SAMPLER_MIN, 10.0)),
    "atom_set": st.sampled_from(SET_NAMES),
    "seed": st.one_of(st.none(), INT64),
    "step": INT32,
    "max_new_tokens": st.integers(0, 12),
    "history_weight": st.one_of(st.none(), st.just(0.0), st.sampled_from([5e-324, 1e-300, 1e300, 1.7e308]),
                                st.floats(0, 50)),
    "history_window": st.one_of(st.none(), st.integers(0, 64), st.sampled_from([0, 1, HISTORY_WINDOW_MAX])),
    "stop_tokens": st.one_of(st.none(), st.lists(TOKEN, max_size=4)),
}
ANY = {
    "context": st.one_of(
        st.none(), st.just([]), st.lists(ANY_TOKEN, max_size=40),
        st.lists(st.one_of(ANY_TOKEN, st.none()), min_size=1, max_size=10),
        st.lists(st.lists(TOKEN, min_size=2, max_size=2), min_size=1, max_size=3)),      # 2-D arrays
    "temperature": ANY_FLOAT, "top_k": ANY_INT, "top_p": ANY_FLOAT, "search_radius": ANY_FLOAT,
    "max_neighbors": ANY_INT, "repetition_penalty": ANY_FLOAT,
    "atom_set": st.one_of(st.none(), st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)),
    "seed": st.one_of(st.none(), INT64), "step": st.one_of(st.none(), INT32),
    "max_new_tokens": st.one_of(st.none(), st.integers(-3, 12),
                                st.sampled_from([MAX_NEW_TOKENS + 1, 100_001, 2**31 - 1, -2**31])),
    "history_weight": ANY_FLOAT,
    "history_window": st.one_of(ANY_INT, st.sampled_from([HISTORY_WINDOW_MAX, HISTORY_WINDOW_MAX + 1])),
    "stop_tokens": st.one_of(st.none(), st.lists(st.one_of(ANY_TOKEN, st.none()), max_size=5)),
}
SAMPLER = ("temperature", "top_k", "top_p", "search_radius", "max_neighbors", "repetition_penalty",
           "history_weight", "history_window")


@st.composite
def inputs(draw, names: tuple[str, ...]) -> dict:
    """Valid values for `names`, except for up to two of them, which may be anything."""
    fuzzed = draw(st.sets(st.sampled_from(names), max_size=2))
    return {name: draw(ANY[name] if name in fuzzed else VALID[name]) for name in names}


def _params(a: dict, context_key: str = "context") -> tuple:
    """The arguments up to repetition_penalty; _history(a) gives the two at the end."""
    return (a[context_key], a["temperature"], a["top_k"], a["top_p"], a["search_radius"], a["max_neighbors"],
            a["atom_set"], a["repetition_penalty"])


def _history(a: dict) -> tuple:
    return (a["history_weight"], a["history_window"])


def _sampler_of(a: dict) -> dict:
    return {k: a[k] for k in SAMPLER}


def _expected(db, sets, a: dict, own_error: str | None = None) -> tuple[str | None, FuzzSet | None]:
    """The argument the call must name (None: it must succeed) and the atom set it resolves to.

    The functions check the context, then the sampler arguments, then their own arguments
    (`own_error`: the first bad one, computed by the caller), then the atom set and the ids.
    """
    if _context_error(a["context"]):
        return "context", None
    bad = _sampler_error(**_sampler_of(a)) or own_error
    if bad:
        return bad, None
    fs = _resolve(db, sets, a["atom_set"])
    return _set_error(fs, a["context"]), fs


# -- next_token ---------------------------------------------------------------------------------------

@settings(FUZZ, max_examples=250)
@given(a=inputs(("context", *SAMPLER, "atom_set")))
def test_next_token_gives_a_distribution_or_22023(db, sets, a) -> None:
    rows, error = _call(db, NEXT_TOKEN, (*_params(a), *_history(a)))
    argument, fs = _expected(db, sets, a)
    if argument:
        return _assert_fails_naming(error, argument)
    _assert_succeeds(error)
    if not rows:             # only a search radius can leave no candidate
        return _assert_no_candidate_within_the_radius(db, a, list(a["context"]))
    check_distribution(rows, fs.can_answer(a["context"], a["history_weight"], a["history_window"]))
    if a["temperature"] == 0:
        assert len(rows) == 1 and rows[0][1] == 1.0


# -- sample_next_token ----------------------------------------------------------------------------

@settings(FUZZ, max_examples=120)
@given(a=inputs(("context", *SAMPLER, "atom_set", "seed", "step")))
def test_sample_next_token_gives_a_token_of_the_set_or_22023(db, sets, a) -> None:
    rows, error = _call(db, SAMPLE, (*_params(a), a["seed"], a["step"], *_history(a)))
    argument, fs = _expected(db, sets, a, "step" if a["seed"] is not None and a["step"] is None else None)
    if argument:
        return _assert_fails_naming(error, argument)
    _assert_succeeds(error)
    (token,) = rows[0]
    if token is None:
        _assert_no_candidate_within_the_radius(db, a, list(a["context"]))
    else:
        assert token in fs.can_answer(a["context"], a["history_weight"], a["history_window"])


# -- generate_tokens ------------------------------------------------------------------------------

@settings(FUZZ, max_examples=100)
@given(a=inputs(("context", *SAMPLER, "atom_set", "seed", "max_new_tokens", "stop_tokens")))
def test_generate_tokens_gives_ids_of_the_set_or_22023(db, sets, a) -> None:
    max_new, stop = a["max_new_tokens"], a["stop_tokens"]
    params = _params(a)
    rows, error = _call(db, GENERATE, (a["context"], max_new, *params[1:], a["seed"], stop, *_history(a)))
    bad_max_new = max_new is None or not 0 <= max_new <= MAX_NEW_TOKENS
    argument, fs = _expected(db, sets, a, "max_new_tokens" if bad_max_new else None)
    if argument:
        return _assert_fails_naming(error, argument)
    _assert_succeeds(error)
    (generated,) = rows[0]
    assert len(generated) <= max_new
    context = list(a["context"])
    for token in generated:                # each step's history atoms are those of the context so far
        assert token in fs.can_answer(context, a["history_weight"], a["history_window"]), (token, context)
        context.append(token)
    stops = set(stop or []) - {None}
    if len(generated) < max_new and not (generated and generated[-1] in stops):
        _assert_no_candidate_within_the_radius(db, a, context)     # stopped early without a stop token
    assert not stops & set(generated[:-1])


# -- next_token_batch -------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=3)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=2)),
    max_leaves=8)
VALID["contexts"] = st.lists(st.lists(TOKEN, min_size=1, max_size=8), min_size=1, max_size=4)
ANY["contexts"] = st.one_of(st.lists(st.lists(ANY_TOKEN, max_size=6), max_size=4), json_values)


def _batch_error(contexts) -> str | None:
    if not isinstance(contexts, list) or not contexts:
        return "contexts"
    for j, ctx in enumerate(contexts):
        if not isinstance(ctx, list) or any(
                isinstance(x, bool) or not isinstance(x, (int, float)) or x != int(x) or not -2**31 <= x < 2**31
                for x in ctx) or not ctx:
            return f"contexts[{j}]"
    return None


@settings(FUZZ, max_examples=120)
@given(a=inputs(("contexts", *SAMPLER, "atom_set")))
def test_next_token_batch_gives_one_distribution_per_context_or_22023(db, sets, a) -> None:
    contexts = a["contexts"]
    rows, error = _call(db, BATCH, (json.dumps(contexts), *_params(a, "contexts")[1:], *_history(a)))
    argument = _sampler_error(**_sampler_of(a)) or _batch_error(contexts)
    fs = None
    if argument is None:
        fs = _resolve(db, sets, a["atom_set"])
        argument = _set_error(fs, [int(x) for ctx in contexts for x in ctx])
    if argument:
        return _assert_fails_naming(error, argument)
    _assert_succeeds(error)
    for j in range(len(contexts)):
        mine = [r[1:] for r in rows if r[0] == j]
        context = [int(x) for x in contexts[j]]
        if mine:
            check_distribution(mine, fs.can_answer(context, a["history_weight"], a["history_window"]))
        else:
            _assert_no_candidate_within_the_radius(db, a, context)
    assert {r[0] for r in rows} <= set(range(len(contexts)))


# -- targeted cases ---------------------------------------------------------------------------------

def test_a_context_of_a_million_tokens(db, sets) -> None:
    """10^6 ids: a distribution from each function, and 22023 for a NULL or foreign id at the very end.

    The set's history atoms are on (weight 2, the maximum window 4096): only the context's tail is read.
    """
    fs = sets["decay"]
    ids = np.random.default_rng(0).integers(0, VOCAB, 10**6)
    literal = "{" + ",".join(map(str, ids.tolist())) + "}"       # text: fast to send, parsed by the server
    started = time.monotonic()
    rows, error = _call(db, NEXT_TOKEN, (literal, 1.0, 40, 0.9, None, 100, fs.name, 1.3, None, None))
    _assert_succeeds(error)
    check_distribution(rows, fs.atom_tokens)
    rows, error = _call(db, GENERATE, (literal, 2, 1.0, 40, 0.9, None, 100, fs.name, 1.0, 7, None, None, None))
    _assert_succeeds(error)
    assert len(rows[0][0]) == 2 and set(rows[0][0]) <= fs.atom_tokens
    rows, error = _call(db, BATCH, (json.dumps([ids.tolist()]), 1.0, 40, 0.9, None, 100, fs.name, 1.0, None, None))
    _assert_succeeds(error)
    check_distribution([r[1:] for r in rows], fs.atom_tokens)
    _, error = _call(db, NEXT_TOKEN, (literal[:-1] + ",NULL}", 1.0, 40, 0.9, None, 100, fs.name, 1.0, None, None))
    _assert_fails_naming(error, "context")
    assert "element 1000001 is NULL" in error.diag.message_primary
    _, error = _call(db, SAMPLE, (literal[:-1] + ",999}", 1.0, 40, 0.9, None, 100, fs.name, 1.0, 1, 0, None, None))
    _assert_fails_naming(error, "context")
    assert "token id 999 (element 1000001)" in error.diag.message_primary
    assert time.monotonic() - started < 600      # generous: bounded, not a speed claim


def test_softmax_of_a_far_tail_token_does_not_underflow(db, server_url) -> None:
    """Six equal logits and one 743.5 below: its probability rounds to 0 instead of raising 22003.

    Regression: e / sum(e) with e = exp(-743.5) underflowed float8 and PostgreSQL raised.
    """
    w = np.array([1.0] * 6 + [math.exp(-743.5)])
    with psycopg.connect(server_url) as conn:
        write_atom_set(conn, AtomSetSpec("fuzz_tail", "fuzz", 7, 3, "hand-made", "token"),
                       TokenRows(np.arange(7), [None] * 7, np.zeros((7, 3))),
                       AtomRows(np.arange(7), np.zeros((7, 3)), w), replace=True)
    try:
        for temperature, top_k, top_p in ((1.0, 0, 1.0), (1.0, 0, 0.999999), (0.01, 0, None)):
            rows, error = _call(db, NEXT_TOKEN, ([1], temperature, top_k, top_p, None, 100, "fuzz_tail", 1.0, None, None))
            _assert_succeeds(error)
            check_distribution(rows, set(range(7)))
    finally:
        with psycopg.connect(server_url) as conn:
            drop_atom_set(conn, "fuzz_tail")


def test_a_long_decayed_context_does_not_underflow_the_centroid(db, sets) -> None:
    """decay 0.5 over 1100 tokens gives weights near 1e-323; times a small coordinate that underflowed."""
    fs = sets["decay"]
    rows, error = _call(db, NEXT_TOKEN, (list(range(VOCAB)) * 18, 1.0, 40, 0.9, None, 100, fs.name, 1.0, None, None))
    _assert_succeeds(error)
    check_distribution(rows, fs.atom_tokens)


def test_generate_tokens_ignores_the_lower_bound_of_the_context_array(db, sets) -> None:
    """'[5:9]={...}' and '{...}' are the same context; the window slice used to assume lower bound 1."""
    fs = sets["wide"]
    ids = "3,9,27,17,40"
    got = [_call(db, GENERATE, (literal, 6, 1.0, 0, 1.0, None, 100, fs.name, 1.0, 11, None, 5.0, 4))
           for literal in (f"[5:9]={{{ids}}}", f"{{{ids}}}")]
    assert got[0][1] is None and got[1][1] is None
    assert got[0][0] == got[1][0]


@pytest.mark.parametrize("window, decay", [(None, 1.0), (None, 0.5), (None, 1e-300), (None, 5e-324), (100, 0.999),
                                           (64, 0.5), (17, 1e-5)])
def test_history_keys_of_a_long_context_stay_finite_at_any_decay(db, server_url, window, decay: float) -> None:
    """Running sums scaled by decay^(r - j) never overflow or underflow: blocks keep |r - j| small."""
    name = "fuzz_history_decay"
    rng = np.random.default_rng(4)
    with psycopg.connect(server_url) as conn:
        write_atom_set(conn, AtomSetSpec(name, "fuzz", VOCAB, 3, "hand-made", "token", centroid_window=window,
                                         centroid_decay=decay),
                       TokenRows(np.arange(VOCAB), [None] * VOCAB, rng.normal(size=(VOCAB, 3)) * 1e3),
                       AtomRows(np.arange(VOCAB), rng.normal(size=(VOCAB, 3)) * 1e3), replace=True)
    try:
        context = rng.integers(0, VOCAB, 6000).tolist()
        for weight, window in ((1.0, HISTORY_WINDOW_MAX), (1e-300, 1), (1e300, 600)):
            rows, error = _call(db, NEXT_TOKEN, (context, 1.0, 0, None, None, 10, name, 1.0, weight, window))
            _assert_succeeds(error)
            check_distribution(rows, set(range(VOCAB)))
    finally:
        with psycopg.connect(server_url) as conn:
            drop_atom_set(conn, name)


def test_generate_tokens_checks_the_context_even_for_zero_new_tokens(db, sets) -> None:
    """Regression (found by the fuzz suite on some seeds): with max_new_tokens = 0 no step ran, so a
    foreign token id was never looked up and the call returned '{}' instead of 22023."""
    fs = sets["plain"]
    rows, error = _call(db, GENERATE, ([3, 7], 0, 1.0, 40, 0.9, None, 100, fs.name, 1.0, 1, None, None, None))
    _assert_succeeds(error)
    assert rows[0][0] == []
    _, error = _call(db, GENERATE, ([3, -1], 0, 1.0, 40, 0.9, None, 100, fs.name, 1.0, 1, None, None, None))
    _assert_fails_naming(error, "context")
    assert "token id -1 (element 2)" in error.diag.message_primary


def test_generate_tokens_accepts_at_most_max_new_tokens(db, sets) -> None:
    fs = sets["plain"]
    rows, error = _call(db, GENERATE, ([1, 2], MAX_NEW_TOKENS, 1.0, 40, 0.9, None, 5, fs.name, 1.0, 3, None, 0.0, 0))
    _assert_succeeds(error)
    assert len(rows[0][0]) == MAX_NEW_TOKENS
    _, error = _call(db, GENERATE, ([1, 2], MAX_NEW_TOKENS + 1, 1.0, 40, 0.9, None, 5, fs.name, 1.0, 3, None,
                                    None, None))
    _assert_fails_naming(error, "max_new_tokens")
    assert "4096" in error.diag.message_primary


# -- draft_tokens -------------------------------------------------------------------------------------
# Its own arguments are checked first (n, first_step with seed, first_step's range, memory), then the
# context, the sampler arguments and the atom set, as next_token checks them.

DRAFT = ("SELECT step, token_id, token_ids, probabilities FROM draft_tokens(%s::int[], %s::int, %s::float8, "
         "%s::int, %s::float8, %s::float8, %s::int, %s::text, %s::float8, %s::bigint, %s::int, %s::int[], "
         "%s::float8, %s::int, %s::boolean)")
MAX_DRAFT = 64
VALID["n"] = st.integers(1, 10)
ANY["n"] = st.one_of(ANY_INT, st.sampled_from([0, MAX_DRAFT, MAX_DRAFT + 1]))
VALID["first_step"] = st.one_of(st.just(0), st.integers(0, 10**6))
ANY["first_step"] = st.one_of(ANY_INT, st.sampled_from([2**31 - 1 - MAX_DRAFT, 2**31 - MAX_DRAFT]))
VALID["memory"] = st.booleans()
ANY["memory"] = st.one_of(st.none(), st.booleans())


def _draft_error(n, seed, first_step, memory) -> str | None:
    if n is None or not 1 <= n <= MAX_DRAFT:
        return "n"
    if seed is not None and first_step is None:
        return "first_step"
    if first_step is not None and not 0 <= first_step <= 2**31 - 1 - n:
        return "first_step"
    if memory is None:
        return "memory"
    return None


def _stops(stop_tokens) -> set[int]:
    return set(stop_tokens or []) - {None}


@settings(FUZZ, max_examples=100)
@given(a=inputs(("context", "n", *SAMPLER, "atom_set", "seed", "first_step", "stop_tokens", "memory")))
def test_draft_tokens_drafts_distributions_of_the_set_or_22023(db, sets, a) -> None:
    n = a["n"]
    params = _params(a)
    rows, error = _call(db, DRAFT, (a["context"], n, *params[1:], a["seed"], a["first_step"], a["stop_tokens"],
                                    *_history(a), a["memory"]))
    own = _draft_error(n, a["seed"], a["first_step"], a["memory"])
    argument, fs = (own, None) if own else _expected(db, sets, a)
    if argument:
        return _assert_fails_naming(error, argument)
    _assert_succeeds(error)
    assert [r[0] for r in rows] == list(range(len(rows))) and len(rows) <= n
    context, stops = list(a["context"]), _stops(a["stop_tokens"])
    for _, token, ids, probabilities in rows:         # each step's q: next_token on the text drafted so far
        check_distribution(list(zip(ids, probabilities)),
                           fs.can_answer(context, a["history_weight"], a["history_window"]))
        assert token in ids
        if a["temperature"] == 0:
            assert ids == [token] and probabilities == [1.0]
        context.append(token)
    if len(rows) < n and not (rows and rows[-1][1] in stops):     # stopped early without a stop token
        _assert_no_candidate_within_the_radius(db, a, context, a["memory"])
    assert not stops & {r[1] for r in rows[:-1]}


# -- draft_tree -----------------------------------------------------------------------------------------
# depth and width first, then next_token's checks (memory, the context, the sampler, the atom set).

TREE = ("SELECT branch, step, token_id FROM draft_tree(%s::int[], %s::int, %s::int, %s::float8, %s::int, "
        "%s::text, %s::float8, %s::int[], %s::float8, %s::int, %s::boolean)")
MAX_WIDTH = 16
VALID["depth"] = st.integers(1, 6)
ANY["depth"] = ANY["n"]
VALID["width"] = st.one_of(st.integers(1, 4), st.just(MAX_WIDTH))
ANY["width"] = st.one_of(ANY_INT, st.sampled_from([0, MAX_WIDTH, MAX_WIDTH + 1]))
TREE_SAMPLER = ("search_radius", "max_neighbors", "repetition_penalty", "history_weight", "history_window")


def _tree_error(a: dict) -> str | None:
    if a["depth"] is None or not 1 <= a["depth"] <= MAX_DRAFT:
        return "depth"
    if a["width"] is None or not 1 <= a["width"] <= MAX_WIDTH:
        return "width"
    if a["memory"] is None:
        return "memory"
    if _context_error(a["context"]):
        return "context"
    return _sampler_error(1.0, a["width"], 1.0, *(a[k] for k in TREE_SAMPLER))


@settings(FUZZ, max_examples=80)
@given(a=inputs(("context", "depth", "width", *TREE_SAMPLER, "atom_set", "stop_tokens", "memory")))
def test_draft_tree_drafts_branches_of_the_set_or_22023(db, sets, a) -> None:
    rows, error = _call(db, TREE, (a["context"], a["depth"], a["width"], a["search_radius"], a["max_neighbors"],
                                   a["atom_set"], a["repetition_penalty"], a["stop_tokens"], *_history(a),
                                   a["memory"]))
    argument, fs = _tree_error(a), None
    if argument is None:
        fs = _resolve(db, sets, a["atom_set"])
        argument = _set_error(fs, a["context"])
    if argument:
        return _assert_fails_naming(error, argument)
    _assert_succeeds(error)
    branches = sorted({r[0] for r in rows})
    assert branches == list(range(1, len(branches) + 1)) and len(branches) <= a["width"]
    assert rows == sorted(rows, key=lambda r: (r[0], r[1]))
    if not branches:
        _assert_no_candidate_within_the_radius(db, a, list(a["context"]), a["memory"])
    firsts = [r[2] for r in rows if r[1] == 0]
    assert len(firsts) == len(branches) == len(set(firsts))          # distinct first tokens, one per branch
    stops = _stops(a["stop_tokens"])
    for b in branches:
        tokens = [r[2] for r in rows if r[0] == b]
        assert [r[1] for r in rows if r[0] == b] == list(range(len(tokens))) and len(tokens) <= a["depth"]
        context = list(a["context"])
        for token in tokens:
            assert token in fs.can_answer(context, a["history_weight"], a["history_window"])
            context.append(token)
        if len(tokens) < a["depth"] and tokens[-1] not in stops:
            _assert_no_candidate_within_the_radius(db, a, context, a["memory"])
        assert not stops & set(tokens[:-1])


# -- remember, forget and set_memory_bound (the owner's) --------------------------------------------
# remember() checks the atom set, context, generated, path, max_atoms, weight, then the ids (generated's,
# then context's), then the length against the set's bound (max_atoms may only lower it). A refused call
# leaves the memory and its bound as they were; an accepted one keeps the memory within the bound,
# evicting whole generations, oldest first.

MEMORY_SET = "fuzz_memory"
REMEMBER = "SELECT * FROM remember(%s::text, %s::int[], %s::int[], %s::text, %s::int, %s::float8, temperature => 0)"
BOUND_LIMIT = 10_000_000
VALID_M = {
    "atom_set": st.just(MEMORY_SET),
    "context": st.lists(TOKEN, min_size=1, max_size=12),
    "generated": st.lists(TOKEN, min_size=1, max_size=12),
    "path": st.sampled_from(["exact", "speculative"]),
    "max_atoms": st.one_of(st.none(), st.integers(1, 40), st.just(BOUND_LIMIT)),
    "weight": st.one_of(st.none(), st.floats(0.01, 100.0), st.sampled_from([5e-324, 1.7e308])),
    "bound": st.one_of(st.integers(1, 40), st.just(BOUND_LIMIT)),
}
ANY_M = {
    # not NULL: that is the database's default set, perhaps another module's
    "atom_set": st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
    "context": ANY["context"], "generated": ANY["context"],
    "path": st.one_of(st.none(), st.sampled_from(["hybrid", "spatial", "augmented", "EXACT", "exact ", ""]),
                      st.text(max_size=8)),
    "max_atoms": st.one_of(ANY_INT, st.sampled_from([0, BOUND_LIMIT + 1])),
    "weight": ANY_FLOAT,
    "bound": st.one_of(ANY_INT, st.sampled_from([0, BOUND_LIMIT + 1])),
}


@pytest.fixture(scope="module")
def owner(server_url: str) -> Iterator[psycopg.Connection]:
    """The owner's connection, and a set of its own whose memory starts empty with a bound of 30."""
    _write(server_url, MEMORY_SET, 5, (-3, 3), 1.0, centroid_window=3, centroid_decay=0.5)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("SELECT set_memory_bound(%s, 30)", (MEMORY_SET,))
        yield conn
        assert conn.execute("SELECT 1").fetchone() == (1,), "the database did not survive the memory calls"
        drop_atom_set(conn, MEMORY_SET)


def _memory_state(conn: psycopg.Connection) -> tuple[list[tuple], int]:
    rows = conn.execute("SELECT m.generation, m.step, m.token_id, m.weight, m.path FROM memory_atoms m "
                        "JOIN atom_sets s ON s.id = m.atom_set_id WHERE s.name = %s ORDER BY 1, 2",
                        (MEMORY_SET,)).fetchall()
    return rows, conn.execute("SELECT max_atoms FROM memory_status(%s)", (MEMORY_SET,)).fetchone()[0]


def _remember_error(a: dict, bound: int, names: set[str]) -> str | None:
    if a["atom_set"] not in names:
        return "atom_set"
    for argument in ("context", "generated"):
        if _context_error(a[argument]):
            return argument
    if a["path"] not in ("exact", "speculative"):
        return "path"
    if a["max_atoms"] is not None and not 1 <= a["max_atoms"] <= BOUND_LIMIT:
        return "max_atoms"
    if a["weight"] is not None and not (0 < a["weight"] < math.inf):
        return "weight"
    for argument in ("generated", "context"):
        if any(not 0 <= t < VOCAB for t in a[argument]):
            return argument
    if len(a["generated"]) > min(bound, a["max_atoms"] or bound):
        return "generated"
    return None


def _generations(rows: list[tuple]) -> list[int]:
    return sorted({r[0] for r in rows})


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_remember_forget_and_the_bound_answer_or_22023_and_keep_the_memory_whole(owner, data) -> None:
    names = {r[0] for r in owner.execute("SELECT name FROM atom_sets")}
    call = data.draw(st.sampled_from(["remember"] * 4 + ["forget", "set_memory_bound"]), label="call")
    fields = {"remember": ("atom_set", "context", "generated", "path", "max_atoms", "weight"),
              "forget": ("atom_set",), "set_memory_bound": ("atom_set", "bound")}[call]
    fuzzed = data.draw(st.sets(st.sampled_from(fields), max_size=2), label="fuzzed")
    a = {k: data.draw(ANY_M[k] if k in fuzzed else VALID_M[k], label=k) for k in fields}
    if a["atom_set"] != MEMORY_SET and a["atom_set"] in names:
        return                                       # another module's set: not this test's to write
    before, bound = _memory_state(owner)
    if call == "remember":
        rows, error = _call(owner, REMEMBER, tuple(a[k] for k in fields))
        argument = _remember_error(a, bound, names)
    elif call == "forget":
        rows, error = _call(owner, "SELECT forget(%s::text)", (a["atom_set"],))
        argument = None if a["atom_set"] in names else "atom_set"
    else:
        rows, error = _call(owner, "SELECT set_memory_bound(%s::text, %s::int)", (a["atom_set"], a["bound"]))
        argument = ("atom_set" if a["atom_set"] not in names else
                    None if a["bound"] is not None and 1 <= a["bound"] <= BOUND_LIMIT else "max_atoms")
    after, bound_after = _memory_state(owner)
    if argument:
        _assert_fails_naming(error, argument)
        assert (after, bound_after) == (before, bound), "a refused call changed the memory"
        return
    _assert_succeeds(error)
    if call == "forget":
        assert rows == [(len(before),)] and after == [] and bound_after == bound
        return
    kept = _generations(after)
    if call == "set_memory_bound":
        assert bound_after == a["bound"] and len(after) <= a["bound"]
        assert rows == [(len(before) - len(after),)]
        old = _generations(before)
        assert kept == old[len(old) - len(kept):]           # the newest whole generations stay
        assert after == [r for r in before if r[0] in kept]
        return
    (generation, remembered, evicted, atoms), = rows
    limit = min(bound, a["max_atoms"] or bound)
    assert bound_after == bound and remembered == len(a["generated"])
    assert atoms == len(after) == len(before) - evicted + remembered <= limit
    assert kept[-1] == generation and generation > max(_generations(before), default=0)
    old = _generations(before)
    assert kept[:-1] == old[len(old) - len(kept) + 1:]        # evicted: the oldest whole generations
    weight = 1.0 if a["weight"] is None else a["weight"]      # the set's history_weight is 0
    assert [r[1:] for r in after if r[0] == generation] == [
        (k, t, weight, a["path"]) for k, t in enumerate(a["generated"])]
