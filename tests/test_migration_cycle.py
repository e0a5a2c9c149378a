"""Every migration's downgrade leaves functions that work: a scratch database walks the chain.

At each revision R: downgrade one step, call every function of the project then installed, upgrade
to R again and call them again; once with R reached from below (each revision in turn, first to
head) and once from head down (a database at head taken back one revision at a time, the functions
installed at head left behind). The functions are read from pg_proc (the public schema, not an
extension's members), so a function added to sql/ or left by a downgrade is called too, and one
without a minimal call here fails; each call runs on a small atom set written with the tables and
columns the schema has at that point, and must answer (the native kernel's own steps only where it
is installed; ht_raise_foreign_token, which exists to raise, must raise its 22023). A downgrade that
leaves a function reading a table or a column it dropped fails here, naming the function, the
revisions and the error.
"""

from __future__ import annotations

import psycopg
from alembic import command
from alembic.script import ScriptDirectory

from hartonomous.db import migrate

SET = "cycle_set"
VOCAB = 8
TOKEN_BLOCK = 256
CENTRE = "ST_MakePoint(0.5, 0.5, 0.5)"
# A function that raises by design: the SQLSTATE it must raise.
RAISES = {"ht_raise_foreign_token": "22023", "ht_file_grams_sync": "0A000"}
# The native kernel's own steps: called where it is installed (0019 on); elsewhere they refuse.
NATIVE = {"ht_native_step", "ht_step_logits"}
# A valid minimal call of each function ({id}: the set's id; the set is named SET, tokens 0 .. VOCAB-1).
CALLS = {
    "context_centroid": f"SELECT context_centroid(ARRAY[1, 2], '{SET}')",
    "draft_sources": f"SELECT * FROM draft_sources(ARRAY[1, 2], ARRAY[3], atom_set => '{SET}')",
    "draft_tokens": f"SELECT * FROM draft_tokens(ARRAY[1, 2], 2, atom_set => '{SET}', seed => 1)",
    "draft_tree": f"SELECT * FROM draft_tree(ARRAY[1, 2], 2, 2, atom_set => '{SET}')",
    "forget": f"SELECT forget('{SET}')",
    "generate_tokens": f"SELECT * FROM generate_tokens(ARRAY[1, 2], 2, atom_set => '{SET}', seed => 1)",
    "ht_atom_set": f"SELECT * FROM ht_atom_set('{SET}')",
    "ht_atom_source": "SELECT ht_atom_source(0::smallint)",
    "ht_backoff_radius": "SELECT ht_backoff_radius(0.1, 1.0, 0.5)",
    "ht_check_between": "SELECT ht_check_between('x', 1, 0, 2, 'hint')",
    "ht_check_context": "SELECT ht_check_context(ARRAY[1, 2])",
    "ht_check_finite_array": "SELECT ht_check_finite_array('x', ARRAY[1.0]::float8[], 1)",
    "ht_check_known_tokens": "SELECT ht_check_known_tokens({id}, ARRAY[1, 2], 'context', 'hint')",
    "ht_check_memory": "SELECT ht_check_memory(false, 'hint')",
    "ht_check_sampler_args": "SELECT ht_check_sampler_args(1.0, 40, 0.9, NULL, 100, 1.0, NULL, NULL)",
    "ht_check_seed_step": "SELECT ht_check_seed_step(1, 0, 'seed', 'hint')",
    "ht_context_centroid": "SELECT * FROM ht_context_centroid({id}, 2, 0.5, ARRAY[1, 2])",
    "ht_context_positions": "SELECT * FROM ht_context_positions({id}, ARRAY[1, 2])",
    "ht_count_knn": "SELECT ht_count_knn(true)",
    "ht_kernel": "SELECT ht_kernel()",
    "ht_knn": f"SELECT * FROM ht_knn({{id}}, {CENTRE}, 5)",
    "ht_knn_arrays": f"SELECT * FROM ht_knn_arrays({{id}}, {CENTRE}, 5)",
    "ht_knn_routed": f"SELECT * FROM ht_knn_routed({{id}}, {CENTRE}, 5, NULL, false)",
    "ht_linear": """SELECT ht_linear('{"intercept": 0, "features": ["a"], "coef": [1], "mean": [0], "scale": [1]}',
                                     '{"a": 1}')""",
    "ht_memory_bound": "SELECT ht_memory_bound({id})",
    "ht_memory_evict": "SELECT ht_memory_evict({id}, 1)",
    "ht_check_set_tokens": "SELECT ht_check_set_tokens({id}, ARRAY[1, 2], 'context')",
    "ht_file_grams": "SELECT ht_file_grams(ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 1])",
    "ht_file_grams_sync": "SELECT ht_file_grams_sync()",
    "ht_gram_rows": "SELECT * FROM ht_gram_rows(ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 1])",
    "ht_needle_keys": "SELECT ht_needle_keys(ARRAY[1, 2, 3, 4])",
    "ht_offsets": "SELECT ht_offsets(ht_token_bytes(ARRAY[1, 2, 1, 2]), ht_token_bytes(ARRAY[1, 2]), 5)",
    "ht_token_bytes": "SELECT ht_token_bytes(ARRAY[1, 2])",
    "ht_source_matches": "SELECT * FROM ht_source_matches({id}, ARRAY[1, 2, 3], 5, false)",
    "ht_memory_policy": "SELECT * FROM ht_memory_policy({id})",
    "ht_memory_refusal": "SELECT ht_memory_refusal({id}, 0, NULL, 1.0, 1.0, false, false)",
    "ht_memory_set": f"SELECT * FROM ht_memory_set('{SET}')",
    "ht_native_step": ("SELECT * FROM ht_native_step({id}, 2, 0.5, 'gaussian', 0.5, 0, 0, ARRAY[1, 2], "
                       "(SELECT xyz FROM ht_context_positions({id}, ARRAY[1, 2])), 1.0, 40, 0.9, NULL, 100, 1.0)"),
    "ht_next_token": (f"SELECT * FROM ht_next_token({{id}}, 'gaussian', 0.5, {CENTRE}, ARRAY[1, 2], 1.0, 40, 0.9, "
                      "NULL, 100, 1.0, NULL, 0)"),
    "ht_pick": "SELECT ht_pick(ARRAY[0.5, 0.5], ARRAY[0.5, 1.0], 0.7)",
    "ht_raise_foreign_token": "SELECT ht_raise_foreign_token({id}, ARRAY[1, 99], 2)",
    "ht_risk": """SELECT ht_risk('{"intercept": 0, "features": ["a"], "coef": [1], "mean": [0], "scale": [1]}',
                                 '{"a": 1}')""",
    "ht_route_cell": "SELECT ht_route_cell(0.1, 0.2, 0.3)",
    "ht_routes": "SELECT ht_routes()",
    "ht_sample": (f"SELECT * FROM ht_sample({{id}}, 'gaussian', 0.5, {CENTRE}, ARRAY[1, 2], 1.0, 40, 0.9, NULL, 100, "
                  "1.0, NULL, 0, 0.5)"),
    "ht_step_logits": f"SELECT * FROM ht_step_logits(ARRAY[1, 2], atom_set => '{SET}')",
    "ht_store_knn": f"SELECT * FROM ht_store_knn({{id}}, {CENTRE}, 5, false)",
    "ht_store_step": ("SELECT * FROM ht_store_step(ARRAY[1, 2], ST_MakePoint(0.1, 0.2, 0.3), NULL, ARRAY[3, 4], "
                      "ARRAY[1.0, 1.0], ARRAY[0.1, 0.2], ARRAY[false, false], 'gaussian', 0.5, 0.5, 0)"),
    "ht_token_positions": "SELECT * FROM ht_token_positions({id}, ARRAY[1, 2])",
    "ht_uniform": "SELECT ht_uniform(1, 0)",
    "knn_routing": "SELECT * FROM knn_routing()",
    "memory_policy": f"SELECT * FROM memory_policy('{SET}')",
    "memory_status": f"SELECT * FROM memory_status('{SET}')",
    "next_token": f"SELECT * FROM next_token(ARRAY[1, 2], atom_set => '{SET}')",
    "next_token_batch": f"SELECT * FROM next_token_batch('[[1, 2], [3]]', atom_set => '{SET}')",
    "next_token_signals": f"SELECT * FROM next_token_signals(ARRAY[1, 2], atom_set => '{SET}')",
    "remember": (f"SELECT * FROM remember('{SET}', ARRAY[1, 2], ARRAY[3, 4], 'exact', temperature => 0, top_k => 0, "
                 "top_p => 1, repetition_penalty => 1, adaptive => false, ignore_eos => false)"),
    "sample_next_token": f"SELECT * FROM sample_next_token(ARRAY[1, 2], atom_set => '{SET}', seed => 1)",
    "save_gate": (f"SELECT save_gate('{SET}', ARRAY['a'], ARRAY[0.0], ARRAY[1.0], ARRAY[0.5], 0, 1, 1, 10, "
                  "'calibration', 1)"),
    "seeded_uniform": "SELECT seeded_uniform(1, 0)",
    "set_memory_bound": f"SELECT set_memory_bound('{SET}', 100)",
    "set_memory_policy": f"SELECT set_memory_policy('{SET}')",
    "store_distribution": f"SELECT * FROM store_distribution(ARRAY[1, 2], '{SET}')",
    "store_sources": f"SELECT * FROM store_sources(ARRAY[1, 2], '{SET}', token => 3)",
    "store_verbatim": f"SELECT * FROM store_verbatim(ARRAY[1, 2, 3], '{SET}', 2)",
}
PROJECT_FUNCTIONS = """
    SELECT DISTINCT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'public' AND p.prokind = 'f'
       AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                                   AND d.deptype = 'e')
     ORDER BY 1"""


def revisions() -> list[str]:
    """Every revision, first to head."""
    script = ScriptDirectory.from_config(migrate.alembic_config("postgresql://unused"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def has(conn: psycopg.Connection, table: str, column: str | None = None) -> bool:
    if column is None:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
    return conn.execute("SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' "
                        "AND table_name = %s AND column_name = %s)", (table, column)).fetchone()[0]


def write_set(conn: psycopg.Connection) -> int:
    """A small context set with the columns the schema has now (every later one has a default)."""
    (set_id,) = conn.execute(
        "INSERT INTO atom_sets (name, model, vocab_size, embedding_dim, projection, kind, centroid_window, "
        "centroid_decay, bandwidth) VALUES (%s, 'test', %s, 3, 'random', 'context', 2, 0.5, 0.5) RETURNING id",
        (SET, VOCAB)).fetchone()
    conn.execute("INSERT INTO tokens (atom_set_id, token_id, text, position) "
                 "SELECT %s, t, 't' || t, ST_MakePoint(t / 8.0, (t * 3 %% 8) / 8.0, (t * 5 %% 8) / 8.0) "
                 "FROM generate_series(0, %s) t", (set_id, VOCAB - 1))
    if has(conn, "token_blocks"):
        conn.execute("INSERT INTO token_blocks (atom_set_id, block, xs, ys, zs) "
                     "SELECT %s, 0, array_agg(x ORDER BY i), array_agg(y ORDER BY i), array_agg(z ORDER BY i) "
                     "FROM (SELECT i, coalesce(ST_X(position), 'NaN') x, coalesce(ST_Y(position), 'NaN') y, "
                     "             coalesce(ST_Z(position), 'NaN') z "
                     "        FROM generate_series(0, %s) i LEFT JOIN tokens ON atom_set_id = %s AND token_id = i) p",
                     (set_id, TOKEN_BLOCK - 1, set_id))
    conn.execute(f"CREATE TABLE atoms_{set_id} PARTITION OF atoms FOR VALUES IN ({set_id})")
    route = ", route" if has(conn, "atoms", "route") else ""
    conn.execute(f"INSERT INTO atoms (atom_set_id, atom_id, token_id, position{route}) "
                 f"SELECT %s, a, a %% {VOCAB}, ST_MakePoint((a %% 7) / 7.0, (a %% 5) / 5.0, (a %% 3) / 3.0)"
                 f"{', a' if route else ''} FROM generate_series(1, 60) a", (set_id,))
    return set_id


def project_functions(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {name for (name,) in conn.execute(PROJECT_FUNCTIONS).fetchall()}


def broken_functions(url: str) -> dict[str, str]:
    """Every project function's minimal call on a fresh set, rolled back: {name: what went wrong}."""
    problems = {}
    names = sorted(project_functions(url))
    with psycopg.connect(url) as conn:
        if not has(conn, "atom_sets"):   # below the first revision: nothing to read, so nothing may be left
            return {name: "left without the schema it reads" for name in names}
        set_id = write_set(conn)
        native = conn.execute("SELECT ht_kernel() = 'native'").fetchone()[0] if "ht_kernel" in names else False
        for name in names:
            if name in NATIVE and not native:
                continue
            if name not in CALLS:
                problems[name] = "no minimal call in tests/test_migration_cycle.py CALLS: add one"
                continue
            try:
                with conn.transaction():
                    conn.execute(CALLS[name].replace("{id}", str(set_id))).fetchall()
                if name in RAISES:
                    problems[name] = f"answered; it must raise {RAISES[name]}"
            except psycopg.Error as exc:
                if exc.sqlstate != RAISES.get(name):
                    problems[name] = f"{exc.sqlstate}: {str(exc).splitlines()[0]}"
        conn.rollback()
    return problems


def cycle(config, revision: str, url: str) -> list[str]:
    """At `revision`: downgrade one step, call every function, upgrade again, call them again."""
    failures = []
    command.downgrade(config, "-1")
    below = migrate.current_revision(url)
    failures += [f"downgraded from {revision} to {below}: {name}: {problem}"
                 for name, problem in broken_functions(url).items()]
    command.upgrade(config, revision)
    failures += [f"at {revision} again: {name}: {problem}" for name, problem in broken_functions(url).items()]
    return failures


def test_each_revision_reached_from_below_cycles_with_working_functions(scratch_database) -> None:
    """Upgrade to each revision in turn (a database migrated to an older revision, then further)."""
    config = migrate.alembic_config(scratch_database)
    failures = []
    for revision in revisions():
        command.upgrade(config, revision)
        failures += cycle(config, revision, scratch_database)
    assert not failures, "\n".join(failures)


def test_each_revision_reached_from_head_cycles_with_working_functions(scratch_database) -> None:
    """From head down, one revision at a time (`hartonomous migrate downgrade REV` on a database at
    head: the functions installed at head are the ones left)."""
    config = migrate.alembic_config(scratch_database)
    command.upgrade(config, "head")
    assert project_functions(scratch_database) == set(migrate.sql_function_needs())   # all of sql/, no other
    failures = [f"at head: {name}: {problem}" for name, problem in broken_functions(scratch_database).items()]
    for revision in reversed(revisions()):
        failures += cycle(config, revision, scratch_database)
        command.downgrade(config, "-1")
    assert not failures, "\n".join(failures)


def test_a_downgrade_below_the_memory_bound_keeps_remember_and_memory_status_working(scratch_database) -> None:
    """0014's downgrade used to drop memory_bounds, which remember() and memory_status() installed at
    head read (42P01); the table stays, and so does the owner's bound."""
    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database) as conn:
        write_set(conn)
        conn.execute(CALLS["set_memory_bound"].replace("100", "3"))
        conn.commit()
    migrate.downgrade(scratch_database, "0013")
    with psycopg.connect(scratch_database) as conn:
        generation, remembered, evicted, atoms = conn.execute(CALLS["remember"]).fetchone()
        assert (remembered, atoms) == (2, 2)
        conn.execute(CALLS["remember"]).fetchone()                  # 4 atoms over a bound of 3: one evicted
        (status,) = conn.execute(f"SELECT to_jsonb(m) FROM memory_status('{SET}') m").fetchone()
        assert status["atoms"] == 2 and status["max_atoms"] == 3
