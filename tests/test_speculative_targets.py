"""bench --speculative --targets: every target of the issue is a row, judged from the measurements given
(benchmarks/speculative_targets.py); no timing is asserted here."""

from __future__ import annotations

import json

from benchmarks.speculative_targets import TARGETS, evaluate, markdown, table, write


def measurements(**over) -> dict:
    """A run's measurements, every row measured: each value can be moved across its target."""
    m = {"unseen": {"exact": {"decode_ms": 12.0}, "speculative": {"decode_ms": 12.5}, "llama": {"decode_ms": 10.0}},
         "short": {"exact": {"decode_ms": 11.0}, "speculative": {"decode_ms": 10.0}},
         "corpus": {"speculative": {"decode_ms": 5.0}, "llama": {"decode_ms": 10.0},
                    "llama_lookup_best": {"decode_ms": 7.0}},
         "repository": {"speculative": {"decode_ms": 8.0}, "llama": {"decode_ms": 10.0}},
         "memory": {"second": {"decode_ms": 4.0}},
         "prompt": {"ours": {"cold_s": 1.5, "extend_s": 0.1}},
         "augmented": {"difference_ms": 0.4},
         "start": {"median_s": 2.6},
         "busy": {"quiet_ms": 20.0, "busy_ms": 50.0}}
    for path, value in over.items():
        node = m
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return m


def by_key(rows: list[dict]) -> dict[str, dict]:
    return {r["key"]: r for r in rows}


def test_every_target_of_the_issue_is_a_row_with_its_goal():
    rows = evaluate(measurements())
    assert [r["key"] for r in rows] == [t.key for t in TARGETS] and len(rows) == 11
    assert all(r["target"] and r["what"] and r["now"] for r in rows)


def test_each_row_is_the_ratio_or_time_the_issue_names_and_met_follows_its_target():
    rows = by_key(evaluate(measurements()))
    expected = {"exact_vs_llama": (1.2, False),            # 12 / 10 ms: slower than llama.cpp
                "first_token_cold": (1.5, False),
                "first_token_extend": (0.1, True),
                "repository_vs_llama": (1.25, False),      # 10 / 8
                "corpus_vs_llama": (2.0, True),            # 10 / 5: the bound itself is met
                "corpus_vs_llama_lookup": (1.4, True),     # 7 / 5
                "memory_second_vs_llama": (2.5, True),     # 10 / 4
                "speculative_vs_plain": (0.96, False),     # min(11 / 10, 12 / 12.5)
                "augmented_cost": (0.4, True),
                "process_start": (2.6, False),
                "busy_neighbour": (2.5, True)}             # 50 / 20
    for key, (value, met) in expected.items():
        assert rows[key]["measured"] == value, key
        assert rows[key]["met"] is met, key


def test_a_row_moves_across_its_target_with_its_measurement():
    assert by_key(evaluate(measurements(unseen__exact={"decode_ms": 9.0})))["exact_vs_llama"]["met"] is True
    assert by_key(evaluate(measurements(unseen__speculative={"decode_ms": 11.0})))["speculative_vs_plain"]["met"]
    assert by_key(evaluate(measurements(busy__busy_ms=61.0)))["busy_neighbour"]["met"] is False
    assert by_key(evaluate(measurements(augmented={"error": "no gate"})))["augmented_cost"]["measured"] is None


def test_a_row_not_measured_stays_in_the_table_as_not_measured():
    m = measurements()
    del m["repository"]
    row = by_key(evaluate(m))["repository_vs_llama"]
    assert row["measured"] is None and row["met"] is None
    line = next(x for x in table(evaluate(m)).splitlines() if x.startswith("| speculative, held-out files of a repo"))
    assert line.endswith("| not measured | — |")


def test_the_json_and_the_table_carry_the_command_the_load_and_every_verdict(tmp_path):
    rows = evaluate(measurements())
    results = {"started": "2026-12-02T18:00:00+0000", "uptime_before": "load average: 7.5", "uptime_after": "8.1",
               "machine": {"cpu": "CPU", "cores": 2}, "forward": "python forward", "llama_cpp": "0.3",
               "llama_cpp_threads": 2, "our_threads_chosen": [1], "prompts": 2, "new_tokens": 64,
               "stores": {"corpus": "code"}, "phases_s": {}, "targets": rows}
    json_path, md_path = write(results, tmp_path, "hartonomous bench --speculative --targets")
    assert json_path.name == "2026-12-02-targets.json"
    data = json.loads(json_path.read_text())
    assert data["command"] == "hartonomous bench --speculative --targets" and data["targets"] == rows
    text = md_path.read_text()
    assert text == markdown(results, "hartonomous bench --speculative --targets")
    assert "load average: 7.5" in text
    verdicts = [line.rsplit("|", 2)[1].strip() for line in text.splitlines() if line.startswith("| ")][1:]
    assert verdicts == ["met" if r["met"] else "missed" for r in rows]
