"""`hartonomous serve` (registered on the app in hartonomous/cli.py)."""

from __future__ import annotations

import ipaddress
import sys
from typing import Optional

import typer

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _log_to_stderr(level: str) -> None:
    """Show the server's own log lines (generations, errors with their ids) next to uvicorn's."""
    import logging

    logger = logging.getLogger("hartonomous")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def register(app: typer.Typer) -> None:
    """Add `serve` to the CLI app."""

    @app.command("serve")
    def serve_cmd(
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback by default)."),
        port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port."),
        atom_set: Optional[str] = typer.Option(None, "--atom-set", help="Default atom set (else the database's)."),
        model: Optional[str] = typer.Option(None, "--model", help="Exact: 'smollm2' or a local model folder."),
        device: Optional[str] = typer.Option(None, "--device", help="Exact: auto | cpu | cuda."),
        dtype: str = typer.Option("float32", "--dtype", help="Exact, torch runtime: float32 | bfloat16 | float16."),
        runtime: Optional[str] = typer.Option(None, "--runtime",
                                              help="Exact: auto | torch | int4 | llama (docs/runtimes.md; auto = "
                                                   "int4 for SmolLM2 in float32 on a CPU with bfloat16, else torch)."),
        preload: bool = typer.Option(True, "--preload/--no-preload",
                                     help="Load the exact model in the background at start-up."),
        log_level: str = typer.Option("info", "--log-level", help="critical | error | warning | info | debug."),
        remember: bool = typer.Option(False, "--remember/--no-remember",
                                      help="Remember completed exact and speculative generations (the exact "
                                           "model's words, under sampler settings the set's memory policy admits: "
                                           "by default greedy and the sampler's defaults, nothing hotter) in the "
                                           "atom set's memory (written by the database owner, never the reader), "
                                           "and let speculative drafts read it. Each response says whether it was "
                                           "remembered. Off by default."),
        memory: bool = typer.Option(False, "--memory/--no-memory",
                                    help="Let speculative drafts and the augmented store read each atom set's "
                                         "memory without writing it: what any server on the same database "
                                         "remembers (serve --remember), from its next request on, with no "
                                         "restart (docs/server.md). --remember implies it. Off by default."),
        memory_max_atoms: Optional[int] = typer.Option(None, "--memory-max-atoms", min=1, max=10_000_000,
                                                       help="With --remember: set this bound on the memory of each "
                                                            "atom set the server writes, in atoms (one per generated "
                                                            "token; the oldest generations are evicted). Default: "
                                                            "each set's own bound (100,000 unless the owner set "
                                                            "one with set_memory_bound)."),
        memory_policy: Optional[str] = typer.Option(None, "--memory-policy",
                                                    help="With --remember: set this sampler policy on the memory "
                                                         "of each atom set the server writes: KEY=VALUE pairs, "
                                                         "comma-separated, KEY one of min_temperature, "
                                                         "max_temperature, min_top_p, max_top_p, max_top_k, "
                                                         "allow_repetition_penalty, allow_adaptive, "
                                                         "allow_ignore_eos; keys left out take the default "
                                                         "policy's (docs/sql.md). Default: each set's own policy."),
        memory_weight: Optional[float] = typer.Option(None, "--memory-weight",
                                                      help="With --remember: a remembered atom's weight (default: "
                                                           "the atom set's history_weight)."),
        threads: Optional[int] = typer.Option(None, "--threads",
                                              help="Threads for the exact model's forwards, 1 to the cores. "
                                                   "Default: the cores less the other processes running, "
                                                   "chosen before each prompt (a busy neighbour made two "
                                                   "threads 4-10x slower than one on 2 cores)."),
        prefix_cache_mb: int = typer.Option(256, "--prefix-cache-mb", min=0, max=1 << 20,
                                            help="Keep recent prompts' KV caches, at most this many MiB, so a "
                                                 "prompt that extends one (an editor's next keystroke, a chat's "
                                                 "next turn) computes only its new part, with the same answer "
                                                 "(int4 runtime; 0: off; SmolLM2 takes 45 KiB a token)."),
    ) -> None:
        """Run the HTTP API (SSE streaming) and the playground page at http://HOST:PORT/."""
        import uvicorn

        from hartonomous.atomset import load_atom_set
        from hartonomous.db.connection import connect, owner_url, reader_url, redact
        from hartonomous.errors import UserError
        from hartonomous.runtimes.threads import check_threads
        from hartonomous.server import ServerConfig, create_app

        check_threads(threads)
        if log_level.lower() not in LOG_LEVELS:
            raise UserError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got '{log_level}'")
        url = reader_url()
        with connect(url, autocommit=True) as conn:          # fail now, in one line, if unreachable
            try:
                info = load_atom_set(conn, atom_set)
                default_set, default_name = f"atom set '{info.name}'", info.name
            except UserError as exc:
                if atom_set is not None:
                    raise
                default_set, default_name = f"no atom set ({exc}); the exact path still works", None
        if memory_weight is not None and not (0 < memory_weight < float("inf")):
            raise UserError(f"--memory-weight must be a positive finite number, got {memory_weight}")
        policy = None
        if memory_policy is not None:
            from hartonomous.memory import MemoryPolicy

            if not remember:
                raise UserError("--memory-policy is the policy of the memory the server writes: add --remember")
            policy = MemoryPolicy.parse(memory_policy)
        writer_url = None
        if remember:
            writer_url = owner_url()
            with connect(writer_url) as conn:              # the memory's writer must connect too
                if policy is not None and default_name is not None:
                    from hartonomous import sqlcalls   # the database checks the policy's values: now, then undone

                    sqlcalls.set_memory_policy(conn, default_name, policy.arguments())
                    conn.rollback()
        _log_to_stderr(log_level)
        config = ServerConfig(database_url=url, atom_set=atom_set, model=model, device=device, dtype=dtype,
                              runtime=runtime, preload_exact=preload, remember=remember, memory=memory,
                              memory_max_atoms=memory_max_atoms,
                              memory_weight=memory_weight, memory_policy=policy, writer_url=writer_url,
                              prefix_cache_mb=prefix_cache_mb, threads=threads)
        if not _is_loopback(host):
            print(f"warning: binding {host}: the API has no authentication; anyone who can reach this "
                  "address can use it", file=sys.stderr)
        shown = f"[{host}]" if ":" in host else host
        bound = f"at most {memory_max_atoms:,} atoms per set" if memory_max_atoms else "each set's own bound"
        rule = "the policy given" if policy is not None else "each set's own sampler policy"
        reading = "; drafts read the sets' memory (written elsewhere)" if memory and not remember else ""
        remembering = f"; remembering generations ({bound}, {rule})" if remember else reading
        print(f"hartonomous: http://{shown}:{port}/ (playground), /docs (API); database {redact(url)}; "
              f"{default_set}{remembering}", file=sys.stderr)
        uvicorn.run(create_app(config=config), host=host, port=port, log_level=log_level.lower(),
                    timeout_graceful_shutdown=10)
