"""The atom sets in the database, with the key facts `hartonomous atom-sets` shows."""

from __future__ import annotations

import psycopg

LIST_SQL = """
SELECT s.name, s.kind, s.is_default, s.model, s.projection, s.centroid_window, s.centroid_decay,
       s.kernel, s.bandwidth, s.vocab_size,
       COALESCE((s.stats->'ingest'->>'atoms')::bigint,
                (SELECT count(*) FROM atoms a WHERE a.atom_set_id = s.id)) AS atoms,
       (s.stats->'projection'->>'trustworthiness')::float8 AS trustworthiness,
       (s.stats->'projection'->>'recall_at_10')::float8 AS recall_at_10,
       (s.stats->'bandwidth'->>'top1')::float8 AS holdout_top1,
       (s.stats->'distill'->>'tokens_per_second')::float8 AS forward_tokens_per_second,
       (s.stats->'ingest'->>'atoms_per_second')::float8 AS ingest_atoms_per_second,
       s.created_at
  FROM atom_sets s
 ORDER BY s.name
"""


def list_atom_sets(conn: psycopg.Connection) -> list[dict]:
    """One dict per atom set (name order); stats that a set lacks are None."""
    cur = conn.execute(LIST_SQL)
    names = [c.name for c in cur.description]
    rows = [dict(zip(names, row)) for row in cur.fetchall()]
    conn.rollback()
    return rows
