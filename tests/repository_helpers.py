"""A small repository on disk and the tiny model, for the index tests (tests/test_repository_*.py)."""

from __future__ import annotations

import functools
import random
from pathlib import Path

from tiny_model import tiny_model

# pkg/mod_0.py .. pkg/mod_{FILES-1}.py: by the path hash, 3 of them calibrate (4, 23, 25), 1 is test (28).
FILES = 40
NAMES = ("add", "total", "items", "value", "result", "count", "name", "data", "index", "key")


def module_text(seed: int, functions: int = 3) -> str:
    """A small Python module whose text depends on `seed` only."""
    rng = random.Random(seed)
    lines = ['"""Module {}."""'.format(seed), "", ]
    for f in range(functions):
        a, b = rng.sample(NAMES, 2)
        lines += [f"def {rng.choice(NAMES)}_{f}({a}, {b}):", f"    \"\"\"Return the {a} and the {b}.\"\"\"",
                  f"    {a} = {a} + {b}", f"    return {a} * {rng.randint(1, 9)}", ""]
    return "\n".join(lines) + "\n"


def write_repository(root: Path, files: dict[str, str]) -> Path:
    """Make `root` hold exactly `files` (path -> text): others are removed."""
    root.mkdir(parents=True, exist_ok=True)
    for existing in [p for p in root.rglob("*") if p.is_file()]:
        if existing.relative_to(root).as_posix() not in files:
            existing.unlink()
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    return root


def initial_files() -> dict[str, str]:
    return {f"pkg/mod_{i}.py": module_text(i) for i in range(FILES)}


def tiny_first_index():
    """projection/index.py's first_index with the tiny model (64 landmarks: its vocabulary is 320)."""
    from projection.index import first_index

    model, tokenizer = tiny_model(0)
    return functools.partial(first_index, model_obj=model, tokenizer=tokenizer, landmarks=64)


def index(url: str, root: Path, name: str, **kwargs):
    """`hartonomous index ROOT --name NAME` with the tiny model, quietly."""
    from hartonomous.repository.index import index_repository

    _, tokenizer = tiny_model(0)
    return index_repository(root, name, first_index=tiny_first_index(), model="tiny", tokenizer=tokenizer,
                            database_url=url, progress=False, **kwargs)
