"""README's results table is generated from committed result JSONs and cannot go stale.

The block between README's markers must be exactly what scripts/results_table.py writes from
docs/results/; every number it shows must be in the JSON its row links, at the precision shown;
and every linked JSON's command must be one the CLI's own parser accepts. The generator and the
checks are specified on small hand-made JSONs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_results_table():
    spec = importlib.util.spec_from_file_location("results_table", ROOT / "scripts" / "results_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rt = _load_results_table()
Field, Row = rt.Field, rt.Row


# --- the committed README and JSONs ------------------------------------------------------------

def test_readme_table_is_the_one_generated_from_the_committed_jsons():
    block, _ = rt.generate()
    assert rt.current_block(rt.README.read_text(encoding="utf-8")) == block, "run `make readme`"


def test_every_number_in_the_readme_table_is_in_the_json_its_row_links():
    assert rt.numbers_not_in_json(rt.current_block(rt.README.read_text(encoding="utf-8"))) == []


def test_every_command_the_readme_table_links_is_accepted_by_the_cli_parser():
    assert rt.refused_commands(rt.current_block(rt.README.read_text(encoding="utf-8"))) == []


def test_every_declared_row_reads_a_json_of_the_results_folder_or_none_yet():
    for row in rt.ROWS:
        assert "/" not in row.source and row.source.endswith(".json"), row.source


# --- the generator, on hand-made JSONs --------------------------------------------------------------

def _report(folder: Path, name: str = "report.json", **changes) -> Path:
    """A compare-like report with full provenance; `changes` replace top-level keys (None drops one)."""
    report = {
        "command": "hartonomous compare --atom-set s --max-positions 2000",
        "generated_at": "2026-11-25T09:30:00+00:00",
        "machine": {"cpu": "CPU X", "cores": 16, "gpu": None, "commit": "abcdef1234567890", "load": [1.5, 1.2, 1.0]},
        "fidelity": {"positions": 2000,
                     "spatial": {"top1": {"n": 2000, "mean": 0.298, "ci95": [0.2712, 0.3249]}},
                     "controls": {"random_positions": {"path": {"top1": {"n": 2000, "mean": 0.2945}}}}},
        "headline": [{"metric": "JS", "baseline": 0.4, "baseline_name": "bigram"},
                     {"metric": "top-1 agreement", "baseline": 0.306, "baseline_name": "4-gram + cache"}],
    }
    for key, value in changes.items():
        if value is None:
            report.pop(key)
        else:
            report[key] = value
    path = folder / name
    path.write_text(json.dumps(report), encoding="utf-8")
    return path


TOP1 = Row(claim="top-1", source="report.json",
           measured="{spatial}; best ({name}) {baseline}; random {random}", n="{positions} positions",
           fields={"spatial": Field("fidelity.spatial.top1"),
                   "name": Field("headline[metric=top-1 agreement].baseline_name", "s"),
                   "baseline": Field("headline[metric=top-1 agreement].baseline"),
                   "random": Field("fidelity.controls.random_positions.path.top1", ".2f"),
                   "positions": Field("fidelity.positions", ",.0f")})


def test_a_row_shows_its_values_with_their_interval_and_the_run_they_come_from(tmp_path):
    _report(tmp_path)
    block, left_out = rt.generate((TOP1,), tmp_path)
    assert left_out == []
    assert rt.table_rows(block) == [[
        "top-1",
        "0.298 [0.27, 0.32]; best (4-gram + cache) 0.306; random 0.29",
        "2,000 positions",
        "`hartonomous compare --atom-set s --max-positions 2000`",
        "[report.json](docs/results/report.json) · `abcdef1` · 2026-11-25 · CPU X, 16 cores · load 1.5",
    ]]
    assert block.startswith(rt.BEGIN) and block.endswith(rt.END)


@pytest.mark.parametrize("change, reason", [
    ({"machine": {"cpu": "CPU X", "cores": 16, "load": 1.5}}, "no commit"),
    ({"machine": {"cpu": "CPU X", "cores": 16, "commit": "abcdef1"}}, "no load"),
    ({"command": None}, "no command"),
    ({"generated_at": None}, "no date"),
    ({"fidelity": {"positions": 2000}}, "fidelity.spatial.top1"),
    ({"headline": [{"metric": "top-1 agreement", "baseline": None, "baseline_name": "x"}]}, "baseline"),
])
def test_a_row_whose_json_lacks_provenance_or_a_field_goes_and_says_why(tmp_path, change, reason):
    _report(tmp_path, **change)
    block, left_out = rt.generate((TOP1,), tmp_path)
    assert rt.table_rows(block) == []
    assert [row for row, _ in left_out] == [TOP1] and reason in left_out[0][1]
    assert "\n- top-1\n" in block and "0.298" not in block


def test_a_row_without_its_json_goes(tmp_path):
    block, left_out = rt.generate((TOP1,), tmp_path)
    assert rt.table_rows(block) == [] and "no such file" in left_out[0][1]


def test_only_rows_with_everything_are_shown_in_declaration_order(tmp_path):
    _report(tmp_path, "a.json")
    _report(tmp_path, "b.json", machine={"cpu": "CPU X", "cores": 16})
    rows = tuple(Row(claim=c, source=s, measured="{spatial}", n="{n}",
                     fields={"spatial": Field("fidelity.spatial.top1"), "n": Field("fidelity.positions", "d")})
                 for c, s in [("first", "a.json"), ("second", "b.json"), ("third", "a.json")])
    block, left_out = rt.generate(rows, tmp_path)
    assert [cells[0] for cells in rt.table_rows(block)] == ["first", "third"]
    assert [row.claim for row, _ in left_out] == ["second"]


def test_paths_read_keys_list_indexes_and_the_element_with_a_given_value():
    data = {"latency": [{"atoms": 10000, "ms": 0.8}, {"atoms": 1000000, "ms": 1.0}],
            "rows": [{"distributed": False, "ms": 1.3}, {"distributed": True, "ms": 22.0}],
            "curve": [{"f": 0.25, "a": 0.5}, {"f": 0.5, "a": 0.75}],
            "4-gram + cache": {"top1": 0.3}}
    assert rt.lookup(data, "latency[0].atoms") == 10000
    assert rt.lookup(data, "latency[-1].ms") == 1.0
    assert rt.lookup(data, "rows[distributed=true].ms") == 22.0
    assert rt.lookup(data, "curve[f=0.5].a") == 0.75
    assert rt.lookup(data, "4-gram + cache.top1") == 0.3
    for missing in ("latency[2].ms", "rows[distributed=null].ms", "curve[f=0.75].a", "latency.ms", "nothing"):
        with pytest.raises(rt.Missing):
            rt.lookup(data, missing)


def test_a_value_is_a_plain_number_or_a_mean_with_an_optional_95_percent_interval():
    assert rt.value_with_interval(0.5) == (0.5, None)
    assert rt.value_with_interval("trigram") == ("trigram", None)
    assert rt.value_with_interval({"mean": 0.298, "ci95": [0.27, 0.32]}) == (0.298, (0.27, 0.32))
    assert rt.value_with_interval({"mean": 0.298, "median": 0.0}) == (0.298, None)
    assert rt.render_field({"x": {"mean": 0.4463, "ci95": [0.4249, 0.4681]}}, Field("x")) == "0.446 [0.42, 0.47]"
    assert rt.render_field({"x": 644801}, Field("x", ",.0f")) == "644,801"


def test_an_interval_may_be_an_estimate_with_its_ends_or_sit_beside_the_value():
    auc = {"estimate": 0.8502, "low": 0.8261, "high": 0.8683, "n": 1151, "blocks": 36}
    assert rt.value_with_interval(auc) == (0.8502, (0.8261, 0.8683))
    assert rt.render_field({"auc": auc}, Field("auc")) == "0.850 [0.83, 0.87]"
    assert rt.value_with_interval({"estimate": 0.5, "low": None, "high": None}) == (0.5, None)
    row = {"baseline": 0.3944, "baseline_ci95": [0.3455, 0.4435]}
    assert rt.render_field(row, Field("baseline", interval="baseline_ci95")) == "0.394 [0.35, 0.44]"


def test_a_template_may_not_hold_a_number_of_its_own_or_name_an_unknown_field():
    with pytest.raises(ValueError, match="number of its own"):
        Row(claim="c", source="a.json", measured="top-1 {x}", n="{x}", fields={"x": Field("x")})
    with pytest.raises(ValueError, match="unknown fields"):
        Row(claim="c", source="a.json", measured="{x} and {y}", n="{x}", fields={"x": Field("x")})
    with pytest.raises(ValueError, match="belong in the Field"):
        Row(claim="c", source="a.json", measured="{x:.2f}", n="{x}", fields={"x": Field("x")})


# --- the checks --------------------------------------------------------------------------------------

def test_the_numbers_check_finds_a_number_that_is_not_in_the_json(tmp_path):
    _report(tmp_path)
    block, _ = rt.generate((TOP1,), tmp_path)
    assert rt.numbers_not_in_json(block, tmp_path) == []           # "4" of "4-gram + cache" is a string's
    assert rt.numbers_not_in_json(block.replace("0.306", "0.307"), tmp_path) == ["top-1: 0.307 is not in report.json"]
    assert rt.numbers_not_in_json(block.replace("[0.27, 0.32]", "[0.27, 0.33]"), tmp_path) == [
        "top-1: 0.33 is not in report.json"]
    assert rt.numbers_not_in_json(block.replace("2,000 positions", "2,500 positions"), tmp_path) == [
        "top-1: 2,500 is not in report.json"]


@pytest.mark.parametrize("command", [
    "hartonomous compare --atom-set ctx100 --max-positions 500 --no-generation --out 'reports/a b'",
    "hartonomous bench --quick --out /tmp/bench",
    "hartonomous build --name ctx100 --kind context --max-tokens 100000 --controls",
    "hartonomous atom-sets default ctx100",
])
def test_the_cli_parser_accepts_commands_it_would_run(command):
    assert rt.cli_refusal(command) is None


@pytest.mark.parametrize("command, why", [
    ("hartonomous compare --atom-set s --no-such-option", "No such option"),
    ("hartonomous compare --atom-set s --max-positions many", "--max-positions"),
    ("hartonomous frobnicate", "No such command"),
    ("hartonomous compare --help", "runs nothing"),
    ("hartonomous db", "runs nothing"),
    ("python benchmarks/risk_hybrid.py --positions 500", "not a hartonomous command"),
])
def test_the_cli_parser_refuses_what_the_cli_would_refuse(command, why):
    assert why in rt.cli_refusal(command)


def test_the_command_check_reads_each_linked_json(tmp_path):
    _report(tmp_path, command="hartonomous compare --atom-set s --max-positons 2000")
    block, _ = rt.generate((TOP1,), tmp_path)
    (problem,) = rt.refused_commands(block, tmp_path)
    assert problem.startswith("report.json: ") and "--max-positons" in problem


def test_check_fails_on_a_stale_table_and_passes_once_rewritten(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{rt.BEGIN}\n| a | stale | row |\n{rt.END}\n\nmore\n", encoding="utf-8")
    args = ["--readme", str(readme), "--results", str(tmp_path)]
    assert rt.main([*args, "--check"]) == 1
    assert "not the generated one" in capsys.readouterr().err
    assert rt.main(args) == 0
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# x\n\n") and text.endswith("\n\nmore\n") and "stale" not in text
    assert rt.main([*args, "--check"]) == 0


def test_a_readme_without_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n", encoding="utf-8")
    assert rt.main(["--readme", str(readme), "--results", str(tmp_path), "--check"]) == 2


def _augmented_report(folder: Path) -> Path:
    """A compare report with a real-text section (the fields the augmented row reads)."""
    interval = lambda e, lo, hi: {"estimate": e, "low": lo, "high": hi, "n": 2000, "blocks": 63}   # noqa: E731
    test = lambda b, verdict: {"metric": "nll", "a": "augmented", "b": b, "verdict": verdict}     # noqa: E731
    real = {"positions": 2000,
            "paths": {"exact": {"perplexity": interval(4.2512, 4.01, 4.52), "top1": interval(0.5123, 0.49, 0.53)},
                      "augmented": {"perplexity": interval(3.8841, 3.66, 4.12), "top1": interval(0.5431, 0.52, 0.56)},
                      "counting_exact": {"perplexity": interval(4.1017, 3.87, 4.35)}},
            "counting_exact": {"base": "∞-gram + cache"},
            "comparisons": [test("exact", "ahead"), {**test("exact", "ahead"), "metric": "top1"},
                            test("counting ⊕ exact", "no difference")],
            "perplexity_change": interval(-0.0864, -0.112, -0.061)}
    return _report(folder, rt._AUGMENTED,
                   atom_set={"name": "code-src-1e7"}, real_text=real)


def test_the_augmented_row_reads_the_real_text_section_of_a_compare_report(tmp_path):
    _augmented_report(tmp_path)
    row = next(r for r in rt.ROWS if r.source == rt._AUGMENTED)
    block, left_out = rt.generate((row,), tmp_path)
    assert left_out == []
    measured = rt.table_rows(block)[0][1]
    assert "augmented 3.88 [3.66, 4.12] against exact 4.25 [4.01, 4.52]" in measured
    assert "relative change -0.086 [-0.112, -0.061]" in measured and "augmented ahead" in measured
    assert "0.543 [0.52, 0.56] against 0.512" in measured
    assert "counting ⊕ exact (∞-gram + cache): 4.10 [3.87, 4.35], augmented no difference" in measured
    assert rt.table_rows(block)[0][2] == "2,000 positions of held-out Python files; atom set code-src-1e7"
