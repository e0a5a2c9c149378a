"""Whether a test may run on the native kernel (ext/hartonomous_kernel) or must say why not.

`make install` builds and installs the extension and `migrate` creates it, so under CI=true a
missing native kernel is a failure; elsewhere (an external server, a machine without the server
headers) the tests that need it are skipped with the reason.
"""

from __future__ import annotations

import os

import pytest

REASON = ("the native kernel hartonomous_kernel is not installed on this server "
          "(`make install-kernel`, then `hartonomous migrate`)")


def require_native_kernel() -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs the native kernel: {REASON}")
    pytest.skip(REASON)
