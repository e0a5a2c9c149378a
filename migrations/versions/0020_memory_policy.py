"""The owner's sampler policy for a set's memory: only what the exact model says under allowed settings.

`memory_policies(atom_set_id, min_temperature, max_temperature, min_top_p, max_top_p, max_top_k,
allow_repetition_penalty, allow_adaptive, allow_ignore_eos, set_at)`: each set's policy, beside its
memory bound, written by the owner (`set_memory_policy()`, sql/070_memory.sql; `serve --remember
--memory-policy`); a set without a row has the default policy (greedy and the sampler's defaults,
nothing hotter). The reader role may read it, not write it.

`remember()` now takes the settings a generation ran with (temperature, top_k, top_p,
repetition_penalty, adaptive, ignore_eos), refuses those the set's policy does not admit, and
records them on each remembered atom (the new `memory_atoms` columns). The generations remembered
before this revision ran under settings nobody recorded (a client could have asked for
temperature 100): they are removed, as 0014 removed the hybrid ones.

The downgrade drops `memory_policies` and the functions that write or show it; every set then has
the default policy, which the functions installed at this revision fall back to (so `remember()`
keeps working). The `memory_atoms` columns stay, unused by a revision before 0020: `remember()`
writes them until 0011's downgrade drops the memory (as 0018 keeps `route`).

Revision ID: 0020
Revises: 0019
"""
from alembic import op

from hartonomous.db.migrate import install_sql_functions

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# The settings each remembered atom records: (column, type, NOT NULL, CHECK or None).
SETTINGS = (
    ("temperature", "double precision", True, "temperature >= 0 AND temperature < 'Infinity'"),
    ("top_k", "integer", False, "top_k >= 0"),
    ("top_p", "double precision", True, "top_p > 0 AND top_p <= 1"),
    ("repetition_penalty", "double precision", True,
     "repetition_penalty > 0 AND repetition_penalty < 'Infinity'"),
    ("adaptive", "boolean", True, None),
    ("ignore_eos", "boolean", True, None),
)
WRITER = ("set_memory_policy(text, double precision, double precision, double precision, double precision, "
          "integer, boolean, boolean, boolean)")


def upgrade() -> None:
    op.execute("""
        CREATE TABLE IF NOT EXISTS memory_policies (
            atom_set_id              integer PRIMARY KEY REFERENCES atom_sets(id) ON DELETE CASCADE,
            min_temperature          double precision NOT NULL,
            max_temperature          double precision NOT NULL,
            min_top_p                double precision NOT NULL,
            max_top_p                double precision NOT NULL,
            max_top_k                integer NOT NULL,
            allow_repetition_penalty boolean NOT NULL,
            allow_adaptive           boolean NOT NULL,
            allow_ignore_eos         boolean NOT NULL,
            set_at                   timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT memory_policies_temperature_check
                CHECK (min_temperature >= 0 AND min_temperature <= max_temperature AND max_temperature <= 1e6),
            CONSTRAINT memory_policies_top_p_check
                CHECK (min_top_p >= 0 AND min_top_p <= max_top_p AND max_top_p > 0 AND max_top_p <= 1),
            CONSTRAINT memory_policies_max_top_k_check CHECK (max_top_k BETWEEN 0 AND 1000000)
        )""")
    op.execute("GRANT SELECT ON memory_policies TO hartonomous_reader")
    for column, type_, _, _ in SETTINGS:
        op.execute(f"ALTER TABLE memory_atoms ADD COLUMN IF NOT EXISTS {column} {type_}")
    # Remembered before the settings were recorded (or checked): not known to be the model's words.
    op.execute("DELETE FROM memory_atoms WHERE temperature IS NULL")
    for column, _, not_null, check in SETTINGS:
        if not_null:
            op.execute(f"ALTER TABLE memory_atoms ALTER COLUMN {column} SET NOT NULL")
        if check:
            op.execute(f"ALTER TABLE memory_atoms DROP CONSTRAINT IF EXISTS memory_atoms_{column}_check")
            op.execute(f"ALTER TABLE memory_atoms ADD CONSTRAINT memory_atoms_{column}_check CHECK ({check})")
    # remember() changed its signature and set_memory_policy() is new: install sql/ (it revokes
    # the writers from PUBLIC and the reader role, which 0003's grants would otherwise reach).
    install_sql_functions(op.get_bind().connection.driver_connection.execute)
    op.execute(f"REVOKE EXECUTE ON FUNCTION {WRITER} FROM PUBLIC, hartonomous_reader")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {WRITER}")
    op.execute("DROP FUNCTION IF EXISTS memory_policy(text)")
    op.execute("DROP TABLE IF EXISTS memory_policies")
