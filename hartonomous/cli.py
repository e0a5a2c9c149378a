"""`hartonomous` command line: the composition root (the only place that imports `projection`).

Errors a user can cause print one line on stderr and exit 1; see `main`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import typer
from rich.console import Console

from hartonomous.config import get_settings
from hartonomous.errors import UserError

app = typer.Typer(
    help="Geometric next-token inference in PostgreSQL/PostGIS, measured against exact inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Manage the embedded PostgreSQL cluster (or show the configured server).",
                     no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()


def fail(message: str, code: int = 1) -> None:
    """Print one line on stderr and exit non-zero."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(code)


def _external() -> str | None:
    return get_settings().database_url


@db_app.command("up")
def db_up() -> None:
    """Create (initdb) and start the embedded cluster; a no-op when it is already running."""
    from hartonomous.db.connection import connect, embedded_cluster, owner_url, redact

    if _external():
        with connect(owner_url()) as conn:
            conn.execute("SELECT 1")
        console.print(f"using HARTONOMOUS_DATABASE_URL ({redact(owner_url())}); nothing to start")
        return
    cluster = embedded_cluster()
    outcome = cluster.up()
    console.print(f"embedded database {outcome} on port {cluster.running_port()} ({cluster.data_dir})")


@db_app.command("down")
def db_down() -> None:
    """Stop the embedded cluster cleanly (fast shutdown)."""
    from hartonomous.db.connection import embedded_cluster

    if _external():
        raise UserError("HARTONOMOUS_DATABASE_URL is set; the external server is not managed by hartonomous")
    console.print(f"embedded database {embedded_cluster().down()}")


@db_app.command("status")
def db_status(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show whether the database is up, where, and its migration state."""
    from hartonomous.db.connection import embedded_cluster, owner_url, redact
    from hartonomous.db import migrate

    if _external():
        info: dict = {"mode": "external", "url": redact(owner_url())}
    else:
        info = {"mode": "embedded", **embedded_cluster().status()}
    running = info.get("running", True)
    if running:
        url = owner_url(autostart=False)
        info["revision"] = migrate.current_revision(url)
        info["head"] = migrate.head_revision()
        info["function_drift"] = migrate.function_drift(url) if info["revision"] else []
    if as_json:
        print(json.dumps(info, indent=2, default=str))
    else:
        for key, value in info.items():
            console.print(f"{key:>15}: {value}")
    if not running:
        raise typer.Exit(3)


@db_app.command("url")
def db_url(reader: bool = typer.Option(False, "--reader", help="URL of the least-privilege role.")) -> None:
    """Print the libpq URL (for psql and other tools)."""
    from hartonomous.db.connection import owner_url, reader_url

    print(reader_url(autostart=False) if reader else owner_url(autostart=False))


@db_app.command("psql", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def db_psql(ctx: typer.Context) -> None:
    """Open psql on the database; extra arguments go to psql."""
    from hartonomous.db.connection import owner_url

    psql = shutil.which("psql")
    if psql is None:
        raise UserError("psql is not installed; install postgresql-client (apt-get install postgresql-client)")
    os.execv(psql, [psql, owner_url(), *ctx.args])


@app.command("migrate")
def migrate_cmd(
    revision: str = typer.Argument("head", help="Target revision (default: head)."),
    down: bool = typer.Option(False, "--down", help="Downgrade to REVISION (use 'base' for empty)."),
) -> None:
    """Upgrade the schema to head (or downgrade) and reinstall drifted SQL functions."""
    from hartonomous.db import migrate
    from hartonomous.db.connection import owner_url

    url = owner_url()
    if down:
        migrate.downgrade(url, revision)
        console.print(f"downgraded to {revision}")
        return
    migrate.upgrade(url, revision)
    drift = migrate.function_drift(url)
    if drift and revision == "head":
        migrate.reinstall_sql_functions(url)
        console.print(f"reinstalled {len(drift)} drifted function(s) from sql/")
    console.print(f"database at revision {migrate.current_revision(url)}")


from hartonomous.cli_generate import register as _register_generation  # noqa: E402

_register_generation(app)  # generate, next-token

from hartonomous.compare.cli import register as _register_compare  # noqa: E402

_register_compare(app)  # compare


def main() -> None:
    """Entry point: run the app, turning user-fixable errors into one line and exit 1."""
    import sqlalchemy.exc
    import psycopg

    try:
        app(standalone_mode=False)
    except UserError as exc:
        fail(str(exc))
    except (typer.Exit, SystemExit) as exc:
        sys.exit(getattr(exc, "exit_code", getattr(exc, "code", 0)))
    except (typer.Abort, KeyboardInterrupt):
        fail("interrupted", 130)
    except (psycopg.OperationalError, sqlalchemy.exc.OperationalError) as exc:
        orig = getattr(exc, "orig", None) or exc
        fail(f"database unreachable ({orig}); check HARTONOMOUS_DATABASE_URL or run `hartonomous db up`")
    except sqlalchemy.exc.DBAPIError as exc:
        fail(str(getattr(exc, "orig", exc)).splitlines()[0])
    except psycopg.Error as exc:
        diag = getattr(exc, "diag", None)
        fail(diag.message_primary if diag and diag.message_primary else str(exc).splitlines()[0])
    except Exception as exc:
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # click/typer usage errors
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
