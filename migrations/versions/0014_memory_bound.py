"""The memory's bound is the set's, and the memory holds only the exact model's words.

`memory_bounds(atom_set_id, max_atoms)`: each set's memory bound, written by the owner
(`set_memory_bound()`, sql/070_memory.sql; `serve --remember --memory-max-atoms`) and read by
`remember()`, which enforces it whatever its caller passes (a `max_atoms` argument may only lower
it). A set without a row has the default bound, 100,000 atoms. Atom sets stay immutable: the
bound lives beside them, like the memory. The reader role may read the bound, not write it.

Hybrid generations are no longer remembered: their spatial steps are the store's own guesses,
not the exact model's choices. Their atoms are removed and `memory_atoms.path` is limited to the
paths whose every token the exact model chose (exact, speculative).

The downgrade admits hybrid generations again and keeps `memory_bounds` (unused by a revision before
0014, as 0018 keeps `route`): the functions of sql/ left installed read it, and remember() keeps the
owner's bound. 0011's downgrade drops it with the memory.

Revision ID: 0014
Revises: 0013
"""
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

WRITERS = ("set_memory_bound(text, integer)", "ht_memory_evict(integer, bigint)")


def upgrade() -> None:
    op.execute("""
        CREATE TABLE IF NOT EXISTS memory_bounds (
            atom_set_id integer PRIMARY KEY REFERENCES atom_sets(id) ON DELETE CASCADE,
            max_atoms   integer NOT NULL
                CONSTRAINT memory_bounds_max_atoms_check CHECK (max_atoms BETWEEN 1 AND 10000000),
            set_at      timestamptz NOT NULL DEFAULT now()
        )""")
    op.execute("GRANT SELECT ON memory_bounds TO hartonomous_reader")
    op.execute("DELETE FROM memory_atoms WHERE path NOT IN ('exact', 'speculative')")
    op.execute("ALTER TABLE memory_atoms DROP CONSTRAINT memory_atoms_path_check")
    op.execute("ALTER TABLE memory_atoms ADD CONSTRAINT memory_atoms_path_check "
               "CHECK (path IN ('exact', 'speculative'))")
    # 0002 installed sql/ (set_memory_bound() among it) before 0003 granted the reader EXECUTE on
    # every function: take the writers back (sql/070_memory.sql does the same on a reinstall).
    for writer in WRITERS:
        op.execute(f"""DO $$ BEGIN
            IF to_regprocedure('{writer}') IS NOT NULL THEN
                REVOKE EXECUTE ON FUNCTION {writer} FROM PUBLIC, hartonomous_reader;
            END IF; END $$""")


def downgrade() -> None:
    op.execute("ALTER TABLE memory_atoms DROP CONSTRAINT memory_atoms_path_check")
    op.execute("ALTER TABLE memory_atoms ADD CONSTRAINT memory_atoms_path_check "
               "CHECK (path IN ('exact', 'speculative', 'hybrid'))")
    # memory_bounds stays: the functions of sql/ installed at head (remember(), memory_status(),
    # set_memory_bound()) read it; 0011's downgrade drops it with the memory.
