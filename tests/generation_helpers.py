"""Shared set-up for the generation tests: the tiny model saved to disk and a hand-made atom set.

The atom set covers the tiny tokenizer's 320 tokens at seeded random 3D positions, plus a few
extra atoms per token, so KNN around a context centroid finds a varied distribution.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psycopg

from hartonomous.speculative.draft_cost import ForwardCosts
from tiny_model import tiny_model

# SmolLM2's forward costs on 2 CPU cores (issue 25), for the speculative path's cost model, so that
# what the tests see does not depend on how fast the tiny model runs on a loaded machine.
SMOLLM2_ON_TWO_CORES = ForwardCosts((0.040, 0.064, 0.081, 0.063, 0.061, 0.060, 0.0605, 0.061) + (0.062,) * 7 + (0.072,))


def save_tiny_model(directory: Path) -> Path:
    """Write the tiny model and tokenizer as a local Hugging Face folder (usable as --model)."""
    model, tokenizer = tiny_model(0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_tiny_atom_set(url: str, model: str, seed: int = 0, window: int | None = None, decay: float = 1.0) -> str:
    """A committed token atom set over the tiny vocabulary; returns its (unique) name."""
    from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set

    _, tokenizer = tiny_model(0)
    vocab = len(tokenizer)
    rng = np.random.default_rng(seed)
    positions = rng.normal(size=(vocab, 3))
    extra = 3
    atom_tokens = np.concatenate([np.arange(vocab), rng.integers(0, vocab, size=vocab * extra)])
    atom_positions = np.concatenate([positions, rng.normal(size=(vocab * extra, 3))])
    weights = rng.uniform(0.5, 2.0, size=len(atom_tokens))
    name = f"tiny_{uuid.uuid4().hex[:8]}"
    spec = AtomSetSpec(name=name, model=model, model_key=model, vocab_size=vocab, embedding_dim=32, projection="random",
                       kind="token", centroid_window=window, centroid_decay=decay)
    tokens = TokenRows(np.arange(vocab), [tokenizer.decode([i]) for i in range(vocab)], positions)
    with psycopg.connect(url) as conn:
        write_atom_set(conn, spec, tokens, AtomRows(atom_tokens, atom_positions, weights))
    return name


def drop_atom_set(url: str, name: str) -> None:
    from hartonomous.atomset import drop_atom_set as drop

    with psycopg.connect(url) as conn:
        drop(conn, name)


@contextmanager
def distilled_tiny_set(url: str, folder: Path) -> Iterator[str]:
    """A context set built (`hartonomous build`) from the tiny model's own training text: a drafter
    that is often right and sometimes wrong, as a real one; dropped after the `with` block."""
    from projection.build import BuildOptions, build
    from tiny_model import TRAIN_TEXT

    model, tokenizer = tiny_model(0)
    corpus = folder / "tiny.txt"
    corpus.write_text("\n".join(TRAIN_TEXT))
    name = f"tiny-distilled-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url) as conn:
        build(conn, BuildOptions(name=name, kind="context", model="tiny", corpus=[corpus], max_tokens=3000,
                                 landmarks=64), model=model, tokenizer=tokenizer)
    try:
        yield name
    finally:
        drop_atom_set(url, name)


@contextmanager
def tiny_atom_set(url: str, model: str = "tiny", seed: int = 0) -> Iterator[str]:
    """A tiny token atom set for the duration of a `with` block (a module fixture's lifetime)."""
    name = write_tiny_atom_set(url, model=model, seed=seed)
    try:
        yield name
    finally:
        drop_atom_set(url, name)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run `hartonomous ARGS...` in this process: (exit code, stdout, stderr)."""
    from hartonomous import cli

    argv, sys.argv = sys.argv, ["hartonomous", *args]
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return code, captured.out, captured.err
