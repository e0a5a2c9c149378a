"""A local Citus cluster: one coordinator and N workers, each an embedded PostgreSQL 15 instance.

`hartonomous cluster up --workers N` keeps everything under `<HARTONOMOUS_HOME>/citus/`
(`coordinator/`, `worker-1/`, ...; a `layout.json` remembers the worker count and each worker's
Citus node id). Every node is an `EmbeddedCluster` with `citus` in shared_preload_libraries and
the citus, postgis and vector extensions; the nodes share one set of passwords, which the
coordinator keeps in `pg_dist_authinfo` so that its connections to the workers authenticate.
The coordinator is registered as a node itself (reference tables get a local copy there), and
the workers with `citus_add_node`. Everything is idempotent, like `db up`: running nodes are left
alone, stopped ones are started, and a worker whose port changed is re-pointed with
`citus_update_node`.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from hartonomous.db.cluster import PG_MAJOR, ClusterState, EmbeddedCluster
from hartonomous.errors import UserError

CITUS_EXTENSIONS = ("citus", "postgis", "vector")
# Shards per worker of the local cluster: each task is a round trip on the worker's one cached
# connection, so on a small machine fewer shards cost less (docs/scale-out.md, the capacity plan).
SHARDS_PER_WORKER = 2
# Small nodes: this is a development cluster, several of which may share a 2-core machine.
NODE_CONF = {
    "shared_preload_libraries": "'citus'",
    "shared_buffers": "128MB",
    "max_connections": "60",
    # A worker that is down makes a call fail within seconds instead of hanging: connecting to it
    # times out after 5 s, and the coordinator's connections to the workers (TLS as Citus's
    # default) probe an idle peer after 5 s and give up on unacknowledged data after 10 s (a
    # machine or network that went away; docs/scale-out.md says what this does not catch).
    "citus.node_connection_timeout": "5000",
    "citus.node_conninfo": ("'sslmode=require keepalives=1 keepalives_idle=5 keepalives_interval=2 "
                            "keepalives_count=3 tcp_user_timeout=10000'"),
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    # One connection per worker and query, the one each session caches: a second one would be
    # opened (fork, TLS, SCRAM) and closed again by every query on a small machine.
    "citus.max_adaptive_executor_pool_size": "1",
}
# The workers' planner settings: a routed KNN (sql/015_knn.sql) reaches a worker as
#   ... WHERE route = <cell> AND position &&& <the cell's cube> ORDER BY position <<->> c LIMIT k
# and the planner, multiplying the two (perfectly correlated) selectivities, expects a handful of
# rows: it reads the whole cell by a bitmap of the primary key and the GiST and sorts it (9 ms on a
# 10^4-atom cell of code-src-1e7) instead of walking the GiST in distance order (1 ms). The
# functions pin these settings for their own statements on one node (SET enable_sort = off), but a
# function's settings do not reach the workers, so the workers, which serve nothing but the atoms'
# KNNs, the builds' COPY and index builds, and deletes, run with them (ALTER SYSTEM at `cluster up`).
WORKER_PLANNER = {"enable_sort": "off", "enable_bitmapscan": "off"}
HOST = "127.0.0.1"


class CitusCluster:
    """The coordinator and workers of a local Citus cluster under `root`."""

    def __init__(self, root: Path, pg_bin: Path | None = None):
        self.root = Path(root).expanduser().absolute()
        self._pg_bin = pg_bin
        self.layout_file = self.root / "layout.json"

    # -- layout -----------------------------------------------------------------
    def _layout(self) -> dict:
        if not self.layout_file.exists():
            return {"workers": 0, "node_ids": {}}
        return json.loads(self.layout_file.read_text())

    def _save_layout(self, layout: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.layout_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(layout, indent=2))
        tmp.replace(self.layout_file)

    def _node(self, name: str, workers: int) -> EmbeddedCluster:
        conf = dict(NODE_CONF)
        if name == "coordinator":
            conf["citus.shard_count"] = str(max(1, workers) * SHARDS_PER_WORKER)
        return EmbeddedCluster(self.root / name, self._pg_bin, conf=conf, extensions=CITUS_EXTENSIONS)

    @property
    def worker_count(self) -> int:
        return int(self._layout()["workers"])

    @property
    def coordinator(self) -> EmbeddedCluster:
        return self._node("coordinator", self.worker_count)

    def workers(self) -> list[EmbeddedCluster]:
        n = self.worker_count
        return [self._node(f"worker-{i}", n) for i in range(1, n + 1)]

    def worker(self, index: int) -> EmbeddedCluster:
        """Worker `index` (1-based), as `cluster status` numbers them."""
        return self._node(f"worker-{index}", self.worker_count)

    # -- state ------------------------------------------------------------------
    def is_running(self) -> bool:
        """Whether the coordinator runs (the URL commands use: see hartonomous/db/connection.py)."""
        return self.layout_file.exists() and self.coordinator.running_pid() is not None

    def url(self, role: str = "owner") -> str:
        if not self.layout_file.exists():
            raise UserError("no local Citus cluster; start one with `hartonomous cluster up --workers 2`")
        try:
            return self.coordinator.url(role)
        except UserError:
            raise UserError("the local Citus cluster is not running; start it with `hartonomous cluster up`") from None

    def status(self) -> dict:
        nodes = {"coordinator": self.coordinator.status()}
        for i, worker in enumerate(self.workers(), start=1):
            nodes[f"worker-{i}"] = worker.status()
        info: dict = {"root": str(self.root), "workers": self.worker_count, "nodes": nodes}
        if self.is_running():
            with psycopg.connect(self.url(), connect_timeout=5) as conn:
                info["citus_version"] = conn.execute("SELECT extversion FROM pg_extension "
                                                     "WHERE extname = 'citus'").fetchone()[0]
                info["active_workers"] = [f"{host}:{port}" for host, port in conn.execute(
                    "SELECT * FROM citus_get_active_worker_nodes() ORDER BY 2").fetchall()]
        return info

    # -- lifecycle --------------------------------------------------------------
    def up(self, workers: int | None = None) -> str:
        """Create and start the nodes and register the workers; returns what happened."""
        if not citus_installed(self._pg_bin):
            raise UserError("Citus is not installed for PostgreSQL 15: run scripts/install-citus.sh with "
                            "HARTONOMOUS_CITUS_TARBALL=<path to citus-12.1.12.tar.gz>, or install Citus's "
                            "packages (docs/scale-out.md)")
        layout = self._layout()
        current = int(layout["workers"])
        wanted = current if workers is None else workers
        if wanted < 1:
            raise UserError(f"--workers must be at least 1, got {wanted}")
        if wanted < current:
            raise UserError(f"the cluster has {current} workers; removing workers would strand their shards. "
                            "Run `hartonomous cluster down --delete` to start over with fewer")
        fresh = not self.layout_file.exists()
        layout["workers"] = wanted
        self._save_layout(layout)
        coordinator = self._node("coordinator", wanted)
        if coordinator.state() is None:
            coordinator.init()
        shared = coordinator.state()
        assert shared is not None
        nodes = [coordinator] + [self._node(f"worker-{i}", wanted) for i in range(1, wanted + 1)]
        for node in nodes[1:]:
            if node.state() is None:  # every node gets the coordinator's passwords
                ClusterState(0, shared.password, shared.reader_password).save(node.state_file)
        started = [node.up() for node in nodes]
        self._register(coordinator, nodes[1:], shared, layout)
        self._save_layout(layout)
        if fresh:
            return "created and started"
        return "already running" if all(s == "already running" for s in started) else "started"

    def _register(self, coordinator: EmbeddedCluster, workers: list[EmbeddedCluster],
                  shared: ClusterState, layout: dict) -> None:
        """Authentication for node-to-node connections on every node (workers connect to each other
        for repartitioned queries; Citus does not copy pg_dist_authinfo), then the coordinator and
        worker nodes."""
        for node in (coordinator, *workers):
            with psycopg.connect(node.url(), autocommit=True, connect_timeout=10) as conn:
                for role, password in (("hartonomous", shared.password),
                                       ("hartonomous_reader", shared.reader_password)):
                    conn.execute("DELETE FROM pg_dist_authinfo WHERE nodeid = 0 AND rolename = %s", (role,))
                    conn.execute("INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo) VALUES (0, %s, %s)",
                                 (role, f"password={password}"))
                if node is not coordinator:
                    for name, value in WORKER_PLANNER.items():
                        conn.execute(f"ALTER SYSTEM SET {name} = {value}")
                    conn.execute("SELECT pg_reload_conf()")
        with psycopg.connect(coordinator.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute("SELECT citus_set_coordinator_host(%s, %s)", (HOST, coordinator.running_port()))
            node_ids = layout.setdefault("node_ids", {})
            for i, worker in enumerate(workers, start=1):
                name, port = f"worker-{i}", worker.running_port()
                known = node_ids.get(name)
                row = conn.execute("SELECT nodeport FROM pg_dist_node WHERE nodeid = %s",
                                   (known,)).fetchone() if known else None
                if row is None:
                    (node_ids[name],) = conn.execute("SELECT citus_add_node(%s, %s)", (HOST, port)).fetchone()
                elif row[0] != port:
                    conn.execute("SELECT citus_update_node(%s, %s, %s)", (known, HOST, port))

    def down(self, delete: bool = False) -> list[str]:
        """Stop every node (workers first); with `delete`, remove the data too."""
        import shutil

        outcomes = [f"worker-{i}: {w.down()}" for i, w in enumerate(self.workers(), start=1)]
        coordinator = self.coordinator
        outcomes.append(f"coordinator: {coordinator.down()}")
        if delete:
            for node in [coordinator, *self.workers()]:
                shutil.rmtree(node.data_dir, ignore_errors=True)
                node.state_file.unlink(missing_ok=True)
            shutil.rmtree(self.root, ignore_errors=True)
        return outcomes


def citus_installed(pg_bin: Path | None = None) -> bool:
    """Whether the citus extension is installed for the PostgreSQL whose binaries we use."""
    import subprocess

    from hartonomous.db.cluster import find_pg_bin

    pg_config = find_pg_bin(pg_bin) / "pg_config"
    try:
        sharedir = subprocess.run([str(pg_config), "--sharedir"], capture_output=True, text=True,
                                  check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sharedir = f"/usr/share/postgresql/{PG_MAJOR}"
    return (Path(sharedir) / "extension" / "citus.control").is_file()
