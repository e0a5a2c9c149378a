"""Under CI=true nothing is skipped silently: the conftest hook turns a skip whose reason docs/reliability.md
does not list into a failure, and `optional_parts.missing` fails where it would skip.

The hook runs here on a throwaway suite in a pytest subprocess (`-p optional_parts`, the functions
conftest.py installs), with and without CI=true.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import conftest
import optional_parts

ROOT = Path(__file__).resolve().parent.parent

SUITE = '''
import pytest
import optional_parts

def test_passes():
    assert True

def test_skips_for_an_unlisted_reason():
    pytest.skip("some optional thing is missing")

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_skips_for_a_listed_reason():
    pass

def test_says_a_part_is_missing():
    optional_parts.missing("the widget is not installed")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False

@pytest.fixture
def broken():
    pytest.skip("a fixture without its file")

def test_skips_in_a_fixture(broken):
    pass
'''
MODULE_SKIP = 'import pytest\npytest.skip("not here", allow_module_level=True)\n\ndef test_never():\n    pass\n'
IMPORT_SKIP = 'import pytest\npytest.importorskip("no_such_module_anywhere")\n\ndef test_never():\n    pass\n'
MODULE_MISSING = ('import optional_parts\noptional_parts.missing("the gadget is not installed", module=True)\n\n'
                  'def test_never():\n    pass\n')


def run_suite(tmp_path: Path, ci: bool) -> tuple[dict[str, str], str]:
    """({test: outcome} from pytest's verbose lines, the whole output) of the throwaway suite."""
    (tmp_path / "test_sample.py").write_text(SUITE)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    (tmp_path / "test_import_skip.py").write_text(IMPORT_SKIP)
    (tmp_path / "test_module_missing.py").write_text(MODULE_MISSING)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    if ci:
        env["CI"] = "true"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "optional_parts", "-p", "no:cacheprovider",
                           "--continue-on-collection-errors", "-rA", "-v", "--rootdir", str(tmp_path),
                           "-c", os.devnull, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    outcomes = dict(re.findall(r"^test_sample\.py::(\w+) (PASSED|FAILED|SKIPPED|XFAIL|ERROR)", done.stdout, re.M))
    assert len(outcomes) == 6, done.stdout[-3000:] + done.stderr[-2000:]
    return outcomes, done.stdout


def test_without_ci_every_skip_is_a_skip(tmp_path):
    got, out = run_suite(tmp_path, ci=False)
    assert got == {"test_passes": "PASSED", "test_skips_for_an_unlisted_reason": "SKIPPED",
                   "test_skips_for_a_listed_reason": "SKIPPED", "test_says_a_part_is_missing": "SKIPPED",
                   "test_expected_failure": "XFAIL", "test_skips_in_a_fixture": "SKIPPED"}, out[-3000:]
    assert "SKIPPED [1] test_module_skip.py:2: not here" in out
    assert "SKIPPED [1] test_import_skip.py:2: could not import 'no_such_module_anywhere'" in out
    assert re.search(r"^SKIPPED \[1\] \S*optional_parts\.py:\d+: the gadget is not installed$", out, re.M), out
    assert "ERROR" not in out and "skipped under CI" not in out


def test_under_ci_only_a_listed_skip_stays_a_skip(tmp_path):
    got, out = run_suite(tmp_path, ci=True)
    assert got == {"test_passes": "PASSED", "test_skips_for_an_unlisted_reason": "FAILED",
                   "test_skips_for_a_listed_reason": "SKIPPED", "test_says_a_part_is_missing": "FAILED",
                   "test_expected_failure": "XFAIL",
                   "test_skips_in_a_fixture": "ERROR"}, out[-3000:]          # a fixture's skip: in setup
    assert "FAILED test_sample.py::test_skips_for_an_unlisted_reason - skipped under CI=true: " \
           "some optional thing is missing" in out
    assert "FAILED test_sample.py::test_says_a_part_is_missing - Failed: CI needs this: the widget" in out
    assert "ERROR test_sample.py::test_skips_in_a_fixture - skipped under CI=true: a fixture without its file" in out
    assert "ERROR test_module_skip.py - skipped under CI=true: not here" in out        # skips at collection too
    assert "ERROR test_import_skip.py - skipped under CI=true: could not import 'no_such_module_anywhere'" in out
    assert "SKIPPED [1] test_sample.py:11: needs a CUDA device" in out
    assert re.search(r"^ERROR test_module_missing\.py.*CI needs this: the gadget is not installed", out, re.M), out


def test_the_suite_installs_the_hooks():
    assert conftest.pytest_runtest_makereport is optional_parts.pytest_runtest_makereport
    assert conftest.pytest_make_collect_report is optional_parts.pytest_make_collect_report


def test_a_listed_reason_is_matched_by_its_start_only():
    assert optional_parts.allowed("needs a CUDA device")
    assert optional_parts.allowed("needs a CUDA device (torch.cuda.is_available() is False)")
    assert not optional_parts.allowed("this needs a CUDA device")
    assert not optional_parts.allowed("SmolLM2 is not available: anything")


def test_missing_skips_locally_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="the widget"):
        optional_parts.missing("the widget")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI needs this: the widget"):
        optional_parts.missing("the widget")


def allowed_skips_in_the_docs() -> dict[str, str]:
    """The table under docs/reliability.md's "Skips under CI": {reason: why}."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    section = text.split("## Skips under CI", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| (.+?) \|$", section, flags=re.M))


def test_the_allowed_skips_are_the_ones_the_docs_list_with_their_reasons():
    docs = allowed_skips_in_the_docs()
    assert docs == optional_parts.ALLOWED_SKIPS

