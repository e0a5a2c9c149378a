"""The README's five-line examples run as printed, against a real database.

The SQL runs as the least-privilege reader on a default atom set as large as SmolLM2's
vocabulary (random positions: the README's token ids must exist, the answers need not be
good); the Python runs on the tiny model, made the default set and the exact model through the
environment, as a user's `Client()` would find them.
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest

from generation_helpers import drop_atom_set, save_tiny_model, write_tiny_atom_set
from hartonomous.config import reload_settings

README = Path(__file__).resolve().parents[1] / "README.md"
SMOLLM2_VOCAB = 49152
PROMPT = "The capital of France is"


def readme_block(language: str) -> str:
    (block,) = re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    return block


def readme_sql_statements() -> list[str]:
    """One statement per line, its trailing comment removed."""
    return [line.split("--")[0].strip().rstrip(";") for line in readme_block("sql").splitlines() if line.strip()]


@contextlib.contextmanager
def as_default(url: str, name: str) -> Iterator[None]:
    """`name` is the default atom set inside the block; the previous default (if any) after it."""
    from hartonomous.atomset.catalog import set_default_atom_set

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT name FROM atom_sets WHERE is_default").fetchone()
        set_default_atom_set(conn, name)
    try:
        yield
    finally:
        with psycopg.connect(url) as conn:
            if row:
                set_default_atom_set(conn, row[0])
            else:
                conn.execute("UPDATE atom_sets SET is_default = false WHERE name = %s", (name,))


@pytest.fixture(scope="module")
def smollm2_sized_set(server_url) -> Iterator[str]:
    """A token set over 49,152 ids at random positions, history atoms on."""
    from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set

    rng = np.random.default_rng(7)
    positions = rng.random((SMOLLM2_VOCAB, 3))
    name = "readme_sql_example"
    spec = AtomSetSpec(name=name, model="test", vocab_size=SMOLLM2_VOCAB, embedding_dim=3, projection="random",
                       kind="token", bandwidth=0.05, centroid_window=3, centroid_decay=0.5)
    with psycopg.connect(server_url) as conn:
        write_atom_set(conn, spec, TokenRows(np.arange(SMOLLM2_VOCAB), [None] * SMOLLM2_VOCAB, positions),
                       AtomRows(np.arange(SMOLLM2_VOCAB), positions, np.ones(SMOLLM2_VOCAB)))
        conn.execute("UPDATE atom_sets SET history_weight = 1 WHERE name = %s", (name,))
    yield name
    drop_atom_set(server_url, name)


def test_the_readme_sql_example_runs_as_the_reader_on_the_default_set(server_url, reader_url, smollm2_sized_set):
    statements = readme_sql_statements()
    assert len(statements) == 5
    with as_default(server_url, smollm2_sized_set), psycopg.connect(reader_url) as reader:
        results = [reader.execute(statement).fetchall() for statement in statements]
    distribution, greedy, (sampled,), (generated,), (signals,) = results
    assert distribution and abs(sum(p for _, p, _ in distribution) - 1) < 1e-9
    assert [(token, p) for token, p, _ in greedy] == [(greedy[0][0], 1.0)]
    assert sampled[0] in {token for token, _, _ in distribution}
    assert len(generated[0]) == 20 and all(0 <= t < SMOLLM2_VOCAB for t in generated[0])
    assert len(signals) >= 10 and signals[0] >= 0        # h, the entropy, first


@pytest.mark.integration
def test_the_readme_sql_token_ids_are_the_prompt_in_smollm2s_tokenizer():
    from hartonomous.model import load_tokenizer

    ids = [int(x) for x in re.search(r"ARRAY\[([\d, ]+)\]", readme_block("sql"))[1].split(",")]
    assert load_tokenizer().encode(PROMPT) == ids
    assert PROMPT in README.read_text(encoding="utf-8")


def test_the_readme_python_example_runs_with_the_default_set_and_model(server_url, reader_url, tmp_path,
                                                                       monkeypatch, capsys):
    tiny_dir = save_tiny_model(tmp_path / "tiny")
    name = write_tiny_atom_set(server_url, model=str(tiny_dir), seed=4)
    for variable, value in [("DATABASE_URL", server_url), ("READER_DATABASE_URL", reader_url),
                            ("MODEL", str(tiny_dir)), ("DEVICE", "cpu")]:
        monkeypatch.setenv(f"HARTONOMOUS_{variable}", value)
    reload_settings()
    try:
        with as_default(server_url, name):
            exec(compile(readme_block("python"), str(README), "exec"), {})
    finally:
        monkeypatch.undo()
        reload_settings()
        drop_atom_set(server_url, name)
    out = capsys.readouterr().out
    assert out.startswith("spatial ") and "\nexact " in out           # generated text may hold newlines
    rows = ast.literal_eval(out.splitlines()[-1])
    assert 1 <= len(rows) <= 5 and all(isinstance(text, str) and 0 < p <= 1 for text, p in rows)
