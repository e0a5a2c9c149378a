"""`hartonomous generate` without --path: augmented where the atom set has corpus labels and a gate,
exact otherwise (hartonomous/paths/default.py); spatial only when asked for (or --in-database)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from generation_helpers import drop_atom_set, run_cli, save_tiny_model, write_tiny_atom_set
from hartonomous.augment.gates import save_gate
from hartonomous.config import reload_settings
from test_augmented_path import GATE
from tiny_model import TRAIN_TEXT, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def corpus_set(server_url, tmp_path_factory, tiny_dir):
    """A set built with corpus labels from the tiny model's folder, with a hand-picked gate."""
    from projection.build import BuildOptions, build

    model, tokenizer = tiny_model(0)
    corpus = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    corpus.write_text("\n".join(TRAIN_TEXT))
    name = f"tiny-default-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url) as conn:
        build(conn, BuildOptions(name=name, kind="context", model=str(tiny_dir), corpus=[corpus],
                                 max_tokens=3000, landmarks=64, target="corpus", gate=False),
              model=model, tokenizer=tokenizer)
    with psycopg.connect(server_url, autocommit=True) as conn:
        save_gate(conn, name, GATE)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture(scope="module")
def model_labelled_set(server_url):
    name = write_tiny_atom_set(server_url, model="tiny", window=3, decay=0.5)
    yield name
    drop_atom_set(server_url, name)


def generate(capsys, tiny_dir, *args: str) -> tuple[int, dict, str]:
    code, out, err = run_cli(capsys, "generate", PROMPT, "--temperature", "0", "--max-new-tokens", "6",
                             "--ignore-eos", "--model", str(tiny_dir), "--device", "cpu", "--json", *args)
    return code, (json.loads(out) if code == 0 else {}), err


def test_a_set_with_corpus_labels_and_a_gate_generates_on_the_augmented_path(capsys, database_env, corpus_set,
                                                                              tiny_dir):
    code, body, err = generate(capsys, tiny_dir, "--atom-set", corpus_set)
    assert code == 0 and body["path"] == "augmented"
    assert err.splitlines()[0] == (f"[path] augmented: atom set '{corpus_set}' has corpus labels and a gate "
                                   f"(--path picks another)")
    code, explicit, _ = generate(capsys, tiny_dir, "--atom-set", corpus_set, "--path", "augmented")
    assert code == 0 and explicit["token_ids"] == body["token_ids"]


def test_without_a_gate_the_same_set_generates_on_the_exact_path(capsys, database_env, server_url, corpus_set,
                                                                 tiny_dir):
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("DELETE FROM augment_gates WHERE atom_set_id = (SELECT id FROM atom_sets WHERE name = %s)",
                     (corpus_set,))
        try:
            code, body, err = generate(capsys, tiny_dir, "--atom-set", corpus_set)
        finally:
            save_gate(conn, corpus_set, GATE)
    assert code == 0 and body["path"] == "exact"
    assert f"[path] exact: atom set '{corpus_set}' has no gate for the augmented path" in err


def test_a_set_labelled_by_the_model_generates_on_the_exact_path(capsys, database_env, model_labelled_set,
                                                                 tiny_dir):
    code, body, err = generate(capsys, tiny_dir, "--atom-set", model_labelled_set)
    assert code == 0 and body["path"] == "exact"
    assert f"atom set '{model_labelled_set}' has no corpus labels or gate for the augmented path" in err
    code, explicit, _ = generate(capsys, tiny_dir, "--path", "exact")
    assert code == 0 and explicit["token_ids"] == body["token_ids"]


def test_without_a_database_the_exact_path_still_generates(capsys, monkeypatch, tiny_dir):
    monkeypatch.setenv("HARTONOMOUS_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    reload_settings()
    try:
        code, body, err = generate(capsys, tiny_dir)
        named_code, _, named_err = generate(capsys, tiny_dir, "--atom-set", "code")
    finally:
        monkeypatch.delenv("HARTONOMOUS_DATABASE_URL")
        reload_settings()
    assert code == 0 and body["path"] == "exact" and "[path] exact: no database" in err
    assert named_code == 1 and named_err.count("\n") == 1       # a set the user named must be readable


def test_spatial_is_an_explicit_choice(capsys, database_env, corpus_set, tiny_dir):
    code, body, err = generate(capsys, tiny_dir, "--atom-set", corpus_set, "--path", "spatial")
    assert code == 0 and body["path"] == "spatial" and "[path]" not in err
    code, body, err = generate(capsys, tiny_dir, "--atom-set", corpus_set, "--in-database")
    assert code == 0 and body["path"] == "spatial" and "[path]" not in err
