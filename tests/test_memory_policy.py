"""The memory's sampler policy: remember() keeps a generation only under settings the set's owner
allows (sql/070_memory.sql rule 2a, migration 0020), checked in SQL against the set's policy
(memory_policies), recorded on each remembered atom; the default policy admits greedy and the
sampler's defaults and nothing hotter; the owner widens or narrows it, and narrowing forgets what it
now refuses; the Python writer says why a generation was not remembered.

On a real database; the HTTP side (a hostile client of `serve --remember`) is in
test_memory_server.py.
"""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
from hartonomous.errors import UserError
from hartonomous.generation_config import GenerationConfig
from hartonomous.memory import (MemoryPolicy, MemoryWriter, NotRemembered, Remembered,
                                            SamplerSettings)

SET = "memory-policy-test"
VOCAB = 40
CONTEXT = [1, 2, 3]
GENERATED = [7, 8, 9, 10, 11]
GREEDY = dict(temperature=0.0, top_k=None, top_p=None, repetition_penalty=1.0, adaptive=False, ignore_eos=False)
DEFAULTS = dict(GREEDY, temperature=GenerationConfig.temperature, top_k=GenerationConfig.top_k,
                top_p=GenerationConfig.top_p)   # the sampler's defaults: what a request that says nothing runs
DEFAULT_POLICY = (0.0, 1.0, 0.0, 0.9, 40, False, False, False, None)


@pytest.fixture(scope="module")
def policy_set(server_url: str) -> str:
    rng = np.random.default_rng(3)
    with psycopg.connect(server_url) as conn:
        write_atom_set(
            conn,
            AtomSetSpec(name=SET, model="synthetic", vocab_size=VOCAB, embedding_dim=0, projection="synthetic",
                        kind="context", centroid_window=3, centroid_decay=0.5, history_weight=2.0),
            TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], rng.random((VOCAB, 3))),
            AtomRows(rng.integers(0, VOCAB, 400), rng.random((400, 3)), rng.uniform(0.5, 2.0, 400)),
            replace=True,
        )
    return SET


def reset(conn, atom_set) -> None:
    conn.execute("SELECT forget(%s)", (atom_set,))
    conn.execute("DELETE FROM memory_policies p USING atom_sets s WHERE s.id = p.atom_set_id AND s.name = %s",
                 (atom_set,))


@pytest.fixture
def owner(server_url: str, policy_set: str):
    """An autocommit owner connection on an empty memory under the default policy (so again afterwards)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        reset(conn, policy_set)
        yield conn
        reset(conn, policy_set)


def remember(conn, settings: dict, generated=GENERATED, atom_set=SET):
    return conn.execute(
        "SELECT * FROM remember(%(atom_set)s, %(context)s, %(generated)s, 'exact', temperature => %(temperature)s, "
        "top_k => %(top_k)s, top_p => %(top_p)s, repetition_penalty => %(repetition_penalty)s, "
        "adaptive => %(adaptive)s, ignore_eos => %(ignore_eos)s)",
        dict(settings, atom_set=atom_set, context=CONTEXT, generated=generated)).fetchone()


def held(conn, atom_set=SET) -> list[tuple]:
    """(generation, temperature, top_k, top_p, repetition_penalty, adaptive, ignore_eos, atoms) per generation."""
    return conn.execute(
        "SELECT m.generation, m.temperature, m.top_k, m.top_p, m.repetition_penalty, m.adaptive, m.ignore_eos, count(*)"
        "  FROM memory_atoms m JOIN atom_sets s ON s.id = m.atom_set_id WHERE s.name = %s"
        " GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1", (atom_set,)).fetchall()


def policy(conn, atom_set=SET) -> tuple:
    return conn.execute("SELECT * FROM memory_policy(%s)", (atom_set,)).fetchone()


def set_policy(conn, atom_set=SET, **values) -> int:
    names = ", ".join(f"{name} => %({name})s" for name in values)
    return conn.execute(f"SELECT set_memory_policy(%(atom_set)s{', ' + names if names else ''})",
                        dict(values, atom_set=atom_set)).fetchone()[0]


# -- the default policy --------------------------------------------------------------------------

def test_a_set_without_a_policy_has_the_default_one(owner):
    """Greedy and the sampler's defaults (T 1, top-k 40, top-p 0.9), nothing hotter; set_at NULL: never set."""
    assert policy(owner) == DEFAULT_POLICY
    assert (GenerationConfig.temperature, GenerationConfig.top_k, GenerationConfig.top_p) == (1.0, 40, 0.9)


def test_greedy_and_the_samplers_defaults_are_remembered_with_their_settings(owner):
    greedy = remember(owner, GREEDY)
    sampled = remember(owner, DEFAULTS)
    colder = remember(owner, dict(DEFAULTS, temperature=0.7, top_k=10, top_p=0.5))
    assert [g[1] for g in (greedy, sampled, colder)] == [len(GENERATED)] * 3
    assert held(owner) == [
        (greedy[0], 0.0, None, 1.0, 1.0, False, False, len(GENERATED)),       # top_p off is recorded as 1
        (sampled[0], 1.0, 40, 0.9, 1.0, False, False, len(GENERATED)),
        (colder[0], 0.7, 10, 0.5, 1.0, False, False, len(GENERATED)),
    ]


def test_greedy_is_remembered_whatever_its_top_k_and_top_p(owner):
    """At temperature 0 top-k and top-p change nothing: the argmax is the argmax."""
    remember(owner, dict(GREEDY, top_k=None, top_p=1.0))
    remember(owner, dict(GREEDY, top_k=500, top_p=0.99))
    assert len(held(owner)) == 2


HOT = [
    (dict(DEFAULTS, temperature=100.0), "temperature 100 is outside the set's memory policy (0 .. 1)"),
    (dict(DEFAULTS, temperature=1.01), "temperature 1.01 is outside the set's memory policy (0 .. 1)"),
    (dict(DEFAULTS, top_k=None), "top_k off is outside the set's memory policy (top_k 1 .. 40) when sampling"),
    (dict(DEFAULTS, top_k=0), "top_k off is outside the set's memory policy (top_k 1 .. 40) when sampling"),
    (dict(DEFAULTS, top_k=41), "top_k 41 is outside the set's memory policy (top_k 1 .. 40) when sampling"),
    (dict(DEFAULTS, top_p=None), "top_p 1 is outside the set's memory policy (0 .. 0.9) when sampling"),
    (dict(DEFAULTS, top_p=0.95), "top_p 0.95 is outside the set's memory policy (0 .. 0.9) when sampling"),
    (dict(GREEDY, repetition_penalty=1.3), "repetition_penalty 1.3 is not allowed by the set's memory policy (only 1)"),
    (dict(GREEDY, repetition_penalty=0.5), "repetition_penalty 0.5 is not allowed by the set's memory policy (only 1)"),
    (dict(GREEDY, adaptive=True), "adaptive sampling is not allowed by the set's memory policy"),
    (dict(GREEDY, ignore_eos=True), "ignore_eos is not allowed by the set's memory policy"),
]


@pytest.mark.parametrize("settings, message", HOT)
def test_settings_the_policy_does_not_admit_are_refused_naming_the_setting_and_nothing_is_written(
        owner, settings, message):
    remember(owner, GREEDY)
    before = held(owner)
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as error:
        remember(owner, settings)
    assert error.value.diag.message_primary == f"not remembered: {message}"
    assert f"atom set '{SET}'" in error.value.diag.message_detail
    assert "set_memory_policy()" in error.value.diag.message_hint
    assert held(owner) == before


@pytest.mark.parametrize("call, message", [
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact')", "temperature must be stated"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => NULL)", "temperature must be stated"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => 0, repetition_penalty => NULL)",
     "repetition_penalty must be stated"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => 0, adaptive => NULL)", "adaptive must be stated"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => 0, ignore_eos => NULL)", "ignore_eos must be stated"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => 'NaN')", "temperature must be a finite number >= 0"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => -1)", "temperature must be a finite number >= 0"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => 0, top_p => 0)", "top_p must be in (0, 1]"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => 0, top_k => -1)", "top_k must be >= 0"),
    ("remember(%s, ARRAY[1], ARRAY[2], 'exact', temperature => 0, repetition_penalty => 0)",
     "repetition_penalty must be a finite number > 0"),
])
def test_settings_must_be_stated_and_valid(owner, call, message):
    """Nothing is assumed about how a generation ran: a call without its temperature is refused."""
    with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
        owner.execute(f"SELECT * FROM {call}", (SET,))
    assert error.value.diag.message_primary.startswith(message)
    assert held(owner) == []


# -- the owner's policy --------------------------------------------------------------------------

def test_the_owner_widens_the_policy_and_narrowing_it_forgets_what_it_now_refuses(owner):
    greedy = remember(owner, GREEDY)[0]
    assert set_policy(owner, max_temperature=2.0, max_top_p=1.0, max_top_k=0, allow_repetition_penalty=True,
                      allow_adaptive=True, allow_ignore_eos=True) == 0
    assert policy(owner)[:8] == (0.0, 2.0, 0.0, 1.0, 0, True, True, True) and policy(owner)[8] is not None
    hot = dict(temperature=1.5, top_k=None, top_p=None, repetition_penalty=1.2, adaptive=True, ignore_eos=True)
    remember(owner, hot)
    assert [g[1:7] for g in held(owner)] == [(0.0, None, 1.0, 1.0, False, False), (1.5, None, 1.0, 1.2, True, True)]
    assert set_policy(owner) == len(GENERATED)                       # the default again: the hot one is forgotten
    assert [g[0] for g in held(owner)] == [greedy]
    assert policy(owner)[:8] == DEFAULT_POLICY[:8]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="temperature 1.5 is outside"):
        remember(owner, hot)


def test_a_greedy_only_policy_refuses_the_samplers_defaults(owner):
    set_policy(owner, max_temperature=0.0)
    remember(owner, GREEDY)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"temperature 1 is outside .* \(0 \.\. 0\)"):
        remember(owner, DEFAULTS)


def test_an_unchanged_policy_changes_nothing(owner):
    set_policy(owner, max_temperature=0.5)
    first = policy(owner)[8]
    assert set_policy(owner, max_temperature=0.5) == 0
    assert policy(owner)[8] == first
    set_policy(owner, max_temperature=0.6)
    assert policy(owner)[8] > first


@pytest.mark.parametrize("values, message", [
    (dict(min_temperature=-1.0), "min_temperature must be between 0 and 1e+06, got -1"),
    (dict(min_temperature=float("nan")), "min_temperature must be between 0 and 1e+06, got NaN"),
    (dict(min_temperature=2.0), "max_temperature must be between min_temperature (2) and 1e+06, got 1"),
    (dict(max_temperature=float("inf")), "max_temperature must be between min_temperature (0) and 1e+06, got Infinity"),
    (dict(min_top_p=1.5), "min_top_p must be between 0 and 1, got 1.5"),
    (dict(max_top_p=0.0), "max_top_p must be in (0, 1] and at least min_top_p (0), got 0"),
    (dict(min_top_p=0.95), "max_top_p must be in (0, 1] and at least min_top_p (0.95), got 0.9"),
    (dict(max_top_k=-1), "max_top_k must be between 0 and 1000000, got -1"),
    (dict(atom_set="no-such-set"), "atom_set: no atom set named 'no-such-set'"),
])
def test_a_bad_policy_names_the_argument_and_changes_nothing(owner, values, message):
    set_policy(owner, max_temperature=0.5)
    before = policy(owner)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
        set_policy(owner, **values)
    assert message in error.value.diag.message_primary
    assert policy(owner) == before


def test_the_reader_reads_the_policy_and_cannot_change_it(reader_url, owner):
    set_policy(owner, max_temperature=0.5)
    with psycopg.connect(reader_url, autocommit=True) as reader:
        assert reader.execute("SELECT max_temperature FROM memory_policy(%s)", (SET,)).fetchone() == (0.5,)
        for statement in ("SELECT set_memory_policy(%s, max_temperature => 100)",
                          "UPDATE memory_policies SET max_temperature = 100 FROM atom_sets s WHERE s.name = %s"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute(statement, (SET,))
    assert policy(owner)[1] == 0.5


def test_dropping_the_set_drops_its_policy(server_url):
    from hartonomous.atomset import drop_atom_set

    rng = np.random.default_rng(5)
    with psycopg.connect(server_url, autocommit=True) as conn:
        write_atom_set(conn, AtomSetSpec(name="memory-policy-dropped", model="synthetic", vocab_size=VOCAB,
                                         embedding_dim=0, projection="synthetic", kind="context",
                                         centroid_window=3, centroid_decay=0.5),
                       TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], rng.random((VOCAB, 3))),
                       AtomRows(rng.integers(0, VOCAB, 50), rng.random((50, 3)), np.ones(50)), replace=True)
        (set_id,) = conn.execute("SELECT id FROM atom_sets WHERE name = 'memory-policy-dropped'").fetchone()
        set_policy(conn, "memory-policy-dropped", max_temperature=0.5)
        drop_atom_set(conn, "memory-policy-dropped")
        assert conn.execute("SELECT count(*) FROM memory_policies WHERE atom_set_id = %s", (set_id,)).fetchone() == (0,)


# -- the Python writer ---------------------------------------------------------------------------

class Result:
    def __init__(self, config: GenerationConfig, path="exact"):
        self.path, self.finish_reason, self.token_ids, self.prompt_ids = path, "length", [4, 5], list(CONTEXT)
        self.config, self.stats = config, None


def test_the_writer_says_why_a_generation_was_not_remembered(server_url, owner, caplog):
    writer = MemoryWriter(server_url)
    try:
        hot = writer.remember_result(SET, Result(GenerationConfig(temperature=100.0)))
        assert hot == NotRemembered("temperature 100 is outside the set's memory policy (0 .. 1)")
        assert hot.as_dict() == {"remembered": False, "reason": hot.reason, "generation": None, "atoms": 0}
        eos = writer.remember_result(SET, Result(GenerationConfig(temperature=0, stop_at_eos=False)))
        assert eos == NotRemembered("ignore_eos is not allowed by the set's memory policy")
        spatial = writer.remember_result(SET, Result(GenerationConfig(temperature=0), path="spatial"))
        assert isinstance(spatial, NotRemembered) and "spatial path" in spatial.reason
        assert held(owner) == [] and (writer.refused, writer.failed, writer.written) == (2, 0, 0)
        greedy = writer.remember_result(SET, Result(GenerationConfig(temperature=0)))
        assert isinstance(greedy, Remembered) and greedy.as_dict()["remembered"] is True
        assert [g[1:8] for g in held(owner)] == [(0.0, 40, 0.9, 1.0, False, False, 2)]   # as the config ran
    finally:
        writer.close()


def test_the_settings_of_a_config_are_what_it_runs():
    config = GenerationConfig(temperature=0.8, top_k=None, top_p=0.5, repetition_penalty=1.1, adaptive=True,
                              stop_at_eos=False)
    assert SamplerSettings.of(config) == SamplerSettings(0.8, None, 0.5, 1.1, True, True)


def test_a_writer_with_a_policy_sets_it_on_each_set_it_writes(server_url, owner):
    """`serve --remember --memory-policy ...`: the server's policy is the set's before each write."""
    writer = MemoryWriter(server_url, policy=MemoryPolicy(max_temperature=2.0))
    try:
        assert isinstance(writer.remember_result(SET, Result(GenerationConfig(temperature=1.5))), Remembered)
        assert policy(owner)[:5] == (0.0, 2.0, 0.0, 0.9, 40)
    finally:
        writer.close()


@pytest.mark.parametrize("text, expected", [
    ("max_temperature=2, allow_ignore_eos=true", MemoryPolicy(max_temperature=2.0, allow_ignore_eos=True)),
    ("max_top_k=0,max_top_p=1", MemoryPolicy(max_top_k=0, max_top_p=1.0)),
    ("", MemoryPolicy()),
])
def test_the_servers_policy_option_parses(text, expected):
    assert MemoryPolicy.parse(text) == expected


@pytest.mark.parametrize("text, message", [
    ("temperature=2", "KEY one of min_temperature"),
    ("max_temperature", "KEY=VALUE pairs"),
    ("max_temperature=hot", "max_temperature must be a number, got 'hot'"),
    ("max_temperature=nan", "max_temperature must be a finite number"),
    ("allow_adaptive=maybe", "allow_adaptive must be true or false"),
])
def test_a_bad_policy_option_says_what_is_wrong(text, message):
    with pytest.raises(UserError, match=message):
        MemoryPolicy.parse(text)


# -- migration 0020 -------------------------------------------------------------------------------

def test_migration_0020_forgets_unrecorded_generations_and_its_downgrade_leaves_the_memory_working(
        scratch_database):
    """Generations remembered before 0020 ran under settings nobody recorded: the upgrade removes
    them. Below 0020 every set has the default policy: remember() and memory_status() still work
    (finding 7), and hot settings are still refused; the upgrade back brings the owner's policy."""
    from alembic import command

    from hartonomous.db import migrate

    config = migrate.alembic_config(scratch_database)
    command.upgrade(config, "0019")
    rng = np.random.default_rng(7)
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        write_atom_set(conn, AtomSetSpec(name=SET, model="synthetic", vocab_size=VOCAB, embedding_dim=0,
                                         projection="synthetic", kind="context", centroid_window=3,
                                         centroid_decay=0.5),
                       TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], rng.random((VOCAB, 3))),
                       AtomRows(rng.integers(0, VOCAB, 50), rng.random((50, 3)), np.ones(50)))
        (set_id,) = conn.execute("SELECT id FROM atom_sets WHERE name = %s", (SET,)).fetchone()
        conn.execute(f"CREATE TABLE memory_atoms_{set_id} PARTITION OF memory_atoms FOR VALUES IN ({set_id})")
        conn.execute("INSERT INTO memory_atoms (atom_set_id, generation, step, position, token_id, weight, path, "
                     "route) SELECT %s, 1, s, ST_MakePoint(s, 0, 0), 7, 1, 'exact', s FROM generate_series(0, 3) s",
                     (set_id,))

    command.upgrade(config, "0020")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute("SELECT atoms FROM memory_status(%s)", (SET,)).fetchone() == (0,)
        assert policy(conn) == DEFAULT_POLICY
        set_policy(conn, max_temperature=2.0)
        assert remember(conn, dict(DEFAULTS, temperature=1.5))[1] == len(GENERATED)

    command.downgrade(config, "0019")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('memory_policies')").fetchone() == (None,)
        assert conn.execute("SELECT to_regprocedure('memory_policy(text)')").fetchone() == (None,)
        assert remember(conn, GREEDY)[3] == 2 * len(GENERATED)                          # kept, and one more
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="temperature 1.5 is outside .* \\(0 \\.\\. 1\\)"):
            remember(conn, dict(DEFAULTS, temperature=1.5))                             # the default policy
        assert conn.execute("SELECT atoms, generations FROM memory_status(%s)", (SET,)).fetchone() == (
            2 * len(GENERATED), 2)

    command.upgrade(config, "0020")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert policy(conn) == DEFAULT_POLICY                                           # the owner sets it again
        set_policy(conn, max_temperature=2.0)
        remember(conn, dict(DEFAULTS, temperature=1.5))
        assert conn.execute("SELECT generations FROM memory_status(%s)", (SET,)).fetchone() == (3,)
