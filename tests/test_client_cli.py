"""The Python client and the `generate` / `next-token` commands, on the tiny model and a real database."""

from __future__ import annotations

import json
import sys

import psycopg
import pytest

from generation_helpers import drop_atom_set, run_cli, save_tiny_model, write_tiny_atom_set
from hartonomous.client import Client
from hartonomous.config import reload_settings
from hartonomous.errors import UserError
from hartonomous.textstream import decode
from tiny_model import tiny_tokenizer

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def atom_set(server_url, tiny_dir):
    name = write_tiny_atom_set(server_url, model=str(tiny_dir), seed=4)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture
def client(server_url, atom_set, tiny_dir):
    with Client(database_url=server_url, atom_set=atom_set, model=str(tiny_dir), device="cpu") as c:
        yield c


def test_import_hartonomous_is_light():
    import subprocess

    code = "import sys, hartonomous; assert 'torch' not in sys.modules; from hartonomous import Client; print(Client)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "hartonomous.client.Client" in out.stdout


def test_next_token_spatial_equals_sql_rows_with_texts(client, server_url, atom_set):
    rows = client.next_token(PROMPT, top_k=10)
    ids = tiny_tokenizer().encode(PROMPT)
    with psycopg.connect(server_url) as conn:
        sql = conn.execute("SELECT token_id, probability, cumulative_probability FROM "
                           "next_token(%s, 1.0, 10, 0.9, NULL, 100, %s)", (ids, atom_set)).fetchall()
    assert [(r.token_id, r.probability) for r in rows] == [(t, p) for t, p, _ in sql]
    assert [r.cumulative_probability for r in rows] == pytest.approx([c for _, _, c in sql], abs=1e-12)
    assert [r.text for r in rows] == [tiny_tokenizer().decode([t]) for t, _, _ in sql]


def test_next_token_exact_greedy_is_the_argmax(client):
    rows = client.next_token(PROMPT, path="exact", temperature=0.0)
    exact = client.engine("exact").backend.model
    logits = exact.full_logits(tiny_tokenizer().encode(PROMPT))
    assert [(r.token_id, r.probability, r.cumulative_probability) for r in rows] == [(int(logits.argmax()), 1.0, 1.0)]


def test_client_generate_stream_and_in_database(client):
    for path in ("spatial", "exact"):
        result = client.generate(PROMPT, path=path, seed=3, max_new_tokens=8, stop_at_eos=False)
        assert len(result.token_ids) == 8 and result.path == path
        assert result.text == decode(tiny_tokenizer(), result.token_ids)
        assert "".join(client.stream(PROMPT, path=path, seed=3, max_new_tokens=8, stop_at_eos=False)) == result.text
    spatial = client.generate(PROMPT, seed=3, max_new_tokens=8, stop_at_eos=False)
    assert client.generate(PROMPT, in_database=True, seed=3, max_new_tokens=8, stop_at_eos=False).token_ids \
        == spatial.token_ids


def test_client_speculative_greedy_is_the_exact_paths_output_with_stats(client):
    options = dict(temperature=0.0, max_new_tokens=16, stop_at_eos=False)
    expected = client.generate(PROMPT, path="exact", **options)
    result = client.generate(PROMPT, path="speculative", **options)
    assert result.token_ids == expected.token_ids and result.text == expected.text
    assert result.path == "speculative" and result.stats.tokens == 16 and result.stats.drafted > 0
    assert "".join(client.stream(PROMPT, path="speculative", **options)) == expected.text
    with pytest.raises(UserError, match="use path='exact'"):
        client.next_token(PROMPT, path="speculative")


def test_client_rejects_unknown_paths_and_options(client):
    with pytest.raises(UserError, match="path must be"):
        client.generate(PROMPT, path="quantum")
    with pytest.raises(UserError, match="unknown option"):
        client.generate(PROMPT, temprature=0.5)


@pytest.mark.parametrize("args, message", [
    (["generate", ""], "the prompt is empty"),
    (["generate", "   ", "--path", "exact"], "the prompt is empty"),
    (["generate", "hi", "--top-p", "1.5"], "top_p"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "hi", "--max-new-tokens", "4097"], "max_new_tokens must be an integer between 1 and 4096"),
    (["generate", "hi", "--in-database", "--max-new-tokens", "100000"], "max_new_tokens"),
    (["next-token", "  "], "the prompt is empty"),
    (["generate", "hi", "--path", "quantum"], "--path must be spatial or exact"),
    (["next-token", "hi", "--top-k", "-2"], "top_k"),
    (["next-token", "hi", "--path", "speculative"], "--path must be spatial or exact"),
    (["generate", "hi", "--path", "speculative", "--draft-tokens", "0"], "--draft-tokens must be between 1 and 64"),
    (["generate", "hi", "--path", "speculative", "--tree-width", "17"], "--tree-width must be between 1 and 16"),
    (["generate", "hi", "--path", "hybrid", "--risk-threshold", "-1"], "risk_threshold must be a number >= 0"),
    (["generate", "hi", "--cautious-mode", "panic"], "cautious_mode must be one of flatten, signal, abstain"),
    (["generate", "hi", "--explore-risk", "0.9", "--cautious-risk", "0.5"], "explore_risk must be <= cautious_risk"),
])
def test_cli_bad_input_is_one_line_and_nonzero(capsys, monkeypatch, args, message):
    monkeypatch.setenv("HARTONOMOUS_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")  # checked before use
    reload_settings()
    try:
        code, out, err = run_cli(capsys, *args)
    finally:
        monkeypatch.delenv("HARTONOMOUS_DATABASE_URL")
        reload_settings()
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_cli_and_client_defaults_are_generation_configs():
    import inspect

    from typer.main import get_command

    from hartonomous import cli
    from hartonomous.generation_config import GenerationConfig

    commands = get_command(cli.app).commands
    for command, names in (("generate", ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty")),
                           ("next-token", ("temperature", "top_k", "top_p", "repetition_penalty"))):
        defaults = {p.name: p.default for p in commands[command].params}
        assert {n: defaults[n] for n in names} == {n: getattr(GenerationConfig, n) for n in names}, command
    signature = inspect.signature(Client.next_token).parameters
    for name in ("temperature", "top_k", "top_p", "repetition_penalty"):
        assert signature[name].default == getattr(GenerationConfig, name)


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--history-weight", "-1"], "history_weight must be a finite number >= 0"),
    (["next-token", "hi", "--history-window", "4097"], "history_window must be between 0 and 4096"),
])
def test_cli_bad_history_options_are_one_line(capsys, database_env, atom_set, args, message):
    code, out, err = run_cli(capsys, *args, "--atom-set", atom_set)
    assert code == 1 and out == "" and err.count("\n") == 1 and message in err


def test_cli_unknown_atom_set(capsys, database_env):
    code, out, err = run_cli(capsys, "generate", "hi", "--atom-set", "no_such_set")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: no atom set named 'no_such_set' (known: ")
    assert err.endswith("; list them with `hartonomous atom-sets`\n")


def test_cli_generate_both_paths_stream_and_blocking(capsys, database_env, client, atom_set, tiny_dir):
    for path in ("spatial", "exact"):
        expected = client.generate(PROMPT, path=path, seed=5, max_new_tokens=6, stop_at_eos=False)
        common = ["generate", PROMPT, "--path", path, "--seed", "5", "--max-new-tokens", "6", "--ignore-eos",
                  "--atom-set", atom_set, "--model", str(tiny_dir), "--device", "cpu"]
        code, out, err = run_cli(capsys, *common, "--stream")
        assert code == 0 and out == expected.text + "\n"
        assert "tokens/s" in err and f"[{path}] 6 tokens" in err
        code, out, _ = run_cli(capsys, *common, "--json")
        assert code == 0 and json.loads(out)["token_ids"] == expected.token_ids


def test_cli_generate_speculative_streams_the_exact_paths_text_and_its_stats(capsys, database_env, client, atom_set,
                                                                              tiny_dir):
    expected = client.generate(PROMPT, path="exact", temperature=0.0, max_new_tokens=12, stop_at_eos=False)
    common = ["generate", PROMPT, "--path", "speculative", "--temperature", "0", "--max-new-tokens", "12",
              "--ignore-eos", "--atom-set", atom_set, "--model", str(tiny_dir), "--device", "cpu"]
    code, out, err = run_cli(capsys, *common, "--stream", "--draft-tokens", "3")
    assert code == 0 and out == expected.text + "\n"
    assert "[speculative] 12 tokens" in err
    stats_line = err.splitlines()[-1]
    assert stats_line.startswith("[speculative] ") and "rounds" in stats_line and "acceptance" in stats_line
    assert "tokens per forward" in stats_line and "draft " in stats_line and "verify " in stats_line
    code, out, _ = run_cli(capsys, *common, "--json")
    body = json.loads(out)
    assert code == 0 and body["token_ids"] == expected.token_ids and body["path"] == "speculative"
    assert body["stats"]["tokens"] == 12 and body["stats"]["draft_lengths"][0] == 4
    stop = expected.text[len(expected.text) // 2:len(expected.text) // 2 + 2]
    code, out, _ = run_cli(capsys, *common, "--stream", "--stop", stop)       # the same stop rules
    exact = client.generate(PROMPT, path="exact", temperature=0.0, max_new_tokens=12, stop_at_eos=False,
                            stop_strings=(stop,))
    assert code == 0 and out == exact.text + "\n" and len(exact.text) < len(expected.text)
    code, out, _ = run_cli(capsys, *common, "--tree-width", "3", "--json")          # trees: the same text
    assert code == 0 and json.loads(out)["token_ids"] == expected.token_ids


def test_cli_generate_remembers_and_drafts_from_memory(capsys, database_env, client, atom_set, tiny_dir, server_url):
    import psycopg

    common = ["generate", PROMPT, "--temperature", "0", "--max-new-tokens", "12", "--ignore-eos", "--atom-set",
              atom_set, "--model", str(tiny_dir), "--device", "cpu", "--json"]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("SELECT forget(%s)", (atom_set,))
        conn.execute("SELECT set_memory_policy(%s, allow_ignore_eos => true)", (atom_set,))   # --ignore-eos
        code, out, _ = run_cli(capsys, *common, "--path", "exact")
        assert code == 0 and conn.execute("SELECT atoms FROM memory_status(%s)", (atom_set,)).fetchone()[0] == 0
        code, out, _ = run_cli(capsys, *common, "--path", "exact", "--remember")
        exact = json.loads(out)["token_ids"]
        assert code == 0 and conn.execute("SELECT atoms FROM memory_status(%s)", (atom_set,)).fetchone()[0] == 12
        code, out, _ = run_cli(capsys, *common, "--path", "speculative", "--memory")
        assert code == 0 and json.loads(out)["token_ids"] == exact
        assert conn.execute("SELECT atoms FROM memory_status(%s)", (atom_set,)).fetchone()[0] == 12   # read, not written
        conn.execute("SELECT forget(%s)", (atom_set,))


def test_cli_next_token_json_and_table(capsys, database_env, client, atom_set):
    code, out, _ = run_cli(capsys, "next-token", PROMPT, "--json", "--atom-set", atom_set, "--top-k", "5")
    assert code == 0
    assert [r["token_id"] for r in json.loads(out)] == [r.token_id for r in client.next_token(PROMPT, top_k=5)]
    code, out, _ = run_cli(capsys, "next-token", PROMPT, "--atom-set", atom_set, "--top-k", "5")
    assert code == 0 and "probability" in out and "cumulative" in out
