"""`hartonomous cluster up | status | url | down`: the local Citus cluster (docs/scale-out.md).

`hartonomous cluster bench` is benchmarks/cli.py's (wired in by the composition root, hartonomous/cli.py).
"""

from __future__ import annotations

import json

import typer
from rich.console import Console

from hartonomous.errors import UserError

console = Console()
cluster_app = typer.Typer(
    help="A local Citus cluster (a coordinator and N workers of embedded PostgreSQL). While its coordinator "
         "runs, the other commands use it instead of the single-node `db`. docs/scale-out.md.",
    no_args_is_help=True)


def local_cluster():
    """The local Citus cluster this command manages; refused while HARTONOMOUS_DATABASE_URL is set."""
    from hartonomous.config import get_settings
    from hartonomous.db.connection import local_citus

    if get_settings().database_url:
        raise UserError("HARTONOMOUS_DATABASE_URL is set; a Citus coordinator given there is not managed by "
                        "hartonomous (unset it to use the local cluster)")
    return local_citus()


@cluster_app.command("up")
def cluster_up(workers: int = typer.Option(None, "--workers", "-w",
                                           help="Number of workers (default: 2 for a new cluster, else unchanged).")) -> None:
    """Create and start the coordinator and workers and register the workers; idempotent."""
    cluster = local_cluster()
    if workers is None and not cluster.layout_file.exists():
        workers = 2
    outcome = cluster.up(workers)
    ports = ", ".join(f"{name}={node['port']}" for name, node in cluster.status()["nodes"].items())
    console.print(f"Citus cluster {outcome} ({cluster.worker_count} workers; {ports})")


@cluster_app.command("status")
def cluster_status(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show each node (running, port, data dir) and the workers the coordinator sees."""
    cluster = local_cluster()
    if not cluster.layout_file.exists():
        raise UserError("no local Citus cluster; start one with `hartonomous cluster up --workers 2`")
    info = cluster.status()
    if as_json:
        print(json.dumps(info, indent=2, default=str))
    else:
        for name, node in info["nodes"].items():
            state = f"running on port {node['port']}" if node["running"] else "stopped"
            console.print(f"{name:>12}: {state} ({node['data_dir']})")
        for key in ("citus_version", "active_workers"):
            if key in info:
                console.print(f"{key:>12}: {info[key]}")
    if not cluster.is_running():
        raise typer.Exit(3)


@cluster_app.command("url")
def cluster_url(reader: bool = typer.Option(False, "--reader", help="URL of the least-privilege role.")) -> None:
    """Print the coordinator's libpq URL (export it as HARTONOMOUS_DATABASE_URL elsewhere)."""
    print(local_cluster().url("reader" if reader else "owner"))


@cluster_app.command("down")
def cluster_down(delete: bool = typer.Option(False, "--delete", help="Also delete the nodes' data.")) -> None:
    """Stop the workers and the coordinator (fast shutdown)."""
    for line in local_cluster().down(delete=delete):
        console.print(line)


def register(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")
