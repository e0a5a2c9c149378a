"""Atoms know their files: `atom_set_files`, one row per file of an indexed repository, and `atom_sets.root`.

`hartonomous index DIR` (hartonomous/repository/index.py) writes a set whose text is chunked per
file, so a file's atoms depend on that file alone; each file's row keeps what is needed both to
subtract the file's atoms when it changes or goes (its tokens as the store ingested them, at
about 4 bytes a token) and to cite it (its line starts, its license and where that was read).
`file_id` is stable within a set and never reused; `path` is relative to the set's `root`, with
POSIX separators. `atom_sets.root` is the indexed directory (absolute); NULL for sets written by
`build`, which have no file table. The reader role may read the table, not write it.

The downgrade drops the table and the column; indexed sets stay, as sets without files.

Revision ID: 0021
Revises: 0020
"""
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE atom_sets ADD COLUMN IF NOT EXISTS root text")
    op.execute("""
        CREATE TABLE IF NOT EXISTS atom_set_files (
            atom_set_id     integer NOT NULL REFERENCES atom_sets(id) ON DELETE CASCADE,
            file_id         integer NOT NULL,
            path            text NOT NULL,
            content_sha256  bytea NOT NULL,
            size_bytes      bigint NOT NULL,
            n_tokens        integer NOT NULL,
            split           text NOT NULL CONSTRAINT atom_set_files_split_check
                                CHECK (split IN ('train', 'calibration', 'test')),
            license         text,
            license_source  text NOT NULL CONSTRAINT atom_set_files_license_source_check
                                CHECK (license_source IN ('spdx-header', 'license-file', 'package-metadata', 'unknown')),
            added_at        timestamptz NOT NULL DEFAULT now(),
            token_ids       integer[] NOT NULL,
            line_starts     integer[] NOT NULL,
            PRIMARY KEY (atom_set_id, file_id),
            CONSTRAINT atom_set_files_atom_set_id_path_key UNIQUE (atom_set_id, path)
        )""")
    op.execute("GRANT SELECT ON atom_set_files TO hartonomous_reader")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS atom_set_files")
    op.execute("ALTER TABLE atom_sets DROP COLUMN IF EXISTS root")
