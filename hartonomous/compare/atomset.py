"""What the comparison needs to know about one atom set, read from the database."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from hartonomous.errors import UserError


@dataclass(frozen=True)
class AtomSetInfo:
    id: int
    name: str
    model: str
    kind: str
    vocab_size: int
    embedding_dim: int
    projection: str
    centroid_window: int | None
    centroid_decay: float
    kernel: str
    bandwidth: float
    atoms: int
    has_keys: bool
    key_dim: int | None
    stats: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"name": self.name, "model": self.model, "kind": self.kind, "vocab_size": self.vocab_size,
                "embedding_dim": self.embedding_dim, "projection": self.projection,
                "centroid_window": self.centroid_window, "centroid_decay": self.centroid_decay,
                "kernel": self.kernel, "bandwidth": self.bandwidth, "atoms": self.atoms,
                "has_keys": self.has_keys, "key_dim": self.key_dim}


def load_atom_set(conn: psycopg.Connection, name: str) -> AtomSetInfo:
    """The atom set's row plus its atom count and whether its atoms carry full-dimensional keys."""
    row = conn.execute(
        """SELECT id, name, model, kind, vocab_size, embedding_dim, projection, centroid_window,
                  centroid_decay, kernel, bandwidth, stats
             FROM atom_sets WHERE name = %s""", (name,)).fetchone()
    if row is None:
        names = [r[0] for r in conn.execute("SELECT name FROM atom_sets ORDER BY name").fetchall()]
        known = ", ".join(names) if names else "none; build one with `hartonomous build`"
        raise UserError(f"no atom set named '{name}' (known: {known})")
    (set_id, name, model, kind, vocab, dim, projection, window, decay, kernel, bandwidth, stats) = row
    (atoms,) = conn.execute("SELECT count(*) FROM atoms WHERE atom_set_id = %s", (set_id,)).fetchone()
    key = conn.execute("SELECT vector_dims(key) FROM atoms WHERE atom_set_id = %s AND key IS NOT NULL LIMIT 1",
                       (set_id,)).fetchone()
    return AtomSetInfo(int(set_id), name, model, kind, int(vocab), int(dim), projection,
                       None if window is None else int(window), float(decay), kernel, float(bandwidth),
                       int(atoms), key is not None, None if key is None else int(key[0]), dict(stats or {}))


@dataclass(frozen=True)
class Text:
    """One evaluation text and where it came from."""

    source: str
    text: str
    held_out: bool


def holdout_text(info: AtomSetInfo) -> Text:
    """The held-out slice recorded by the builder (stats['holdout'] = {source, text})."""
    holdout = info.stats.get("holdout")
    text = source = None
    if isinstance(holdout, dict):
        text, source = holdout.get("text"), holdout.get("source")
    elif isinstance(holdout, str):
        text = holdout
    if not text or not str(text).strip():
        raise UserError(f"atom set '{info.name}' records no held-out text; pass --text FILE "
                        "(use text that was not used to build the set)")
    return Text(f"held-out slice of {source or 'the build corpus'}", str(text), True)


def read_texts(paths: list[Path]) -> list[Text]:
    """User-supplied evaluation texts (UTF-8 files)."""
    from hartonomous.textfiles import read_user_text

    texts = []
    for path in paths:
        body = read_user_text(path, f"--text {path}")
        texts.append(Text(str(path), body, False))
    return texts


def read_prompts(path: Path) -> list[str]:
    """One prompt per non-empty line (a literal \\n inside a line becomes a newline)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--prompts {path}: no such file")
    prompts = [line.replace("\\n", "\n") for line in path.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    if not prompts:
        raise UserError(f"--prompts {path}: no prompts (one per line)")
    return prompts
