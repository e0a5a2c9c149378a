"""What `index` spends reading a repository before it tokenizes: walk_repository, then detect_license
for every file, per root given (hartonomous/repository/files.py, license.py). Prints one line per root:
the files read and skipped, their size, the seconds of each step, the commonest licenses and their
sources. The machine's load average is printed first, since the machine is shared.

    .venv/bin/python benchmarks/repository_files.py . .venv/lib/python3.11/site-packages/numpy
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

from hartonomous.repository.files import walk_repository
from hartonomous.repository.license import clear_caches, detect_license


def measure(root: Path) -> str:
    clear_caches()
    started = time.perf_counter()
    walk = walk_repository(root)
    walked = time.perf_counter()
    licenses = Counter((found.spdx, found.source) for found in
                       (detect_license(walk.root, f.path, f.text) for f in walk.files))
    done = time.perf_counter()
    size = sum(f.size for f in walk.files) / 1e6
    common = ", ".join(f"{n} {spdx or 'unknown'} ({source})" for (spdx, source), n in licenses.most_common(3))
    return (f"{root}: {walk.summary()}; {size:.1f} MB; walk {walked - started:.2f} s, licenses "
            f"{done - walked:.2f} s; {common}")


def main(argv: list[str]) -> None:
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    for root in argv or ["."]:
        print(measure(Path(root)))


if __name__ == "__main__":
    main(sys.argv[1:])
