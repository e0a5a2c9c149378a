"""What the scripts that record reference vectors share: a throwaway database and the JSON layout.

`main(record, output, description, lists)` parses `--url` (the owner URL of a migrated database;
without it a throwaway embedded cluster is started, migrated and removed, as the tests do), calls
`record(url)` and writes its result to `output` with one case a line, so diffs stay reviewable.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def on_throwaway_cluster(record: Callable[[str], dict]) -> dict:
    from hartonomous.db import migrate
    from hartonomous.db.cluster import EmbeddedCluster

    root = Path(tempfile.mkdtemp(prefix="hartonomous-record-"))
    root.chmod(0o755)
    cluster = EmbeddedCluster(root / "pg")
    cluster.up()
    try:
        migrate.upgrade(cluster.url())
        return record(cluster.url())
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)
        if cluster.data_dir != cluster.requested_dir:
            shutil.rmtree(cluster.data_dir, ignore_errors=True)


def write(output: Path, result: dict, lists: tuple[str, ...]) -> None:
    with output.open("w") as f:
        f.write("{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in result.items() if k not in lists))
        f.write(",\n".join(f'  "{key}": [\n' + ",\n".join(f"    {json.dumps(c)}" for c in result[key]) + "\n  ]"
                           for key in lists) + "\n}\n")


def main(record: Callable[[str], dict], output: Path, description: str, lists: tuple[str, ...] = ("cases",)) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", help="owner URL of a migrated database (default: a throwaway embedded cluster)")
    args = parser.parse_args()
    result = record(args.url) if args.url else on_throwaway_cluster(record)
    write(output, result, lists)
    print(f"wrote {sum(len(result[k]) for k in lists)} cases to {output}")
