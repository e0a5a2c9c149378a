"""`hartonomous generate` and `hartonomous next-token` (registered on the app in cli.py).

Defaults come from GenerationConfig; options are validated by GenerationConfig, the prompt rule
and the backends (before connecting where they can be), so bad input is one UserError line.
Generated text goes to stdout; the statistics line goes to stderr, so output can be piped.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable
from typing import Optional

import typer
from typer.models import OptionInfo

from hartonomous.engine import check_prompt   # light: no torch until used
from hartonomous.generation_config import MAX_NEW_TOKENS, GenerationConfig
from hartonomous.paths import (DEFAULT_PATH, PATHS, describe, next_token_paths, option_home, output_paths,   # light
                               reads_option, rememberable, speculative_targets)
from hartonomous.paths.options import MAX_DRAFT_TOKENS, MAX_TREE_WIDTH, PathOptions, draft_ceiling

NEXT_TOKEN_PATHS = next_token_paths()
PATH_HELP = f"{describe(NEXT_TOKEN_PATHS)}."
GENERATE_PATHS = PATHS
GENERATE_PATH_HELP = (f"{describe()}. Augmented needs a set built with corpus labels and a gate (hartonomous "
                      f"gate fit SET); hybrid's threshold is --risk-threshold. Default: augmented where the atom "
                      f"set has corpus labels and a gate, else exact (stderr says which).")
SPECULATIVE_TARGETS = speculative_targets()


def _option(name: str, annotation, default: OptionInfo) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


# The options `generate` and `next-token` share, declared once; `with_options` adds them to a command.
SAMPLER_OPTIONS = [
    _option("temperature", float, typer.Option(GenerationConfig.temperature, "--temperature", help="0 = greedy.")),
    _option("top_k", int, typer.Option(GenerationConfig.top_k, "--top-k",
                                       help="Keep the k most likely tokens (0 = off).")),
    _option("top_p", float, typer.Option(GenerationConfig.top_p, "--top-p", help="Nucleus mass in (0, 1]; 1 = off.")),
    _option("repetition_penalty", float, typer.Option(GenerationConfig.repetition_penalty, "--repetition-penalty",
                                                      help="> 0; 1 = off.")),
]
CLIENT_OPTIONS = [
    _option("atom_set", Optional[str], typer.Option(None, "--atom-set",
                                                    help="Spatial, augmented: atom set (default set if omitted).")),
    _option("search_radius", Optional[float], typer.Option(None, "--search-radius", help="Spatial: KNN radius.")),
    _option("max_neighbors", int, typer.Option(PathOptions.max_neighbors, "--max-neighbors", help="Spatial: KNN size (1..100000).")),
    _option("history_weight", Optional[float], typer.Option(
        None, "--history-weight", help="Spatial: weight of the context's own history atoms (0 = off; default: the "
                                       "atom set's calibrated weight).")),
    _option("history_window", Optional[int], typer.Option(
        None, "--history-window", help="Spatial: earlier positions that become history atoms (0..4096; default: "
                                       "the atom set's).")),
    _option("augment_weight", Optional[float], typer.Option(
        None, "--augment-weight", help="Augmented, for experiments only: fix λ, the store's weight in the mixture "
                                       "(0..1; 0 = the exact path, 1 = the store alone). Default: the atom set's "
                                       "gate decides λ at every step.")),
    _option("model", Optional[str], typer.Option(None, "--model", help="Exact: 'smollm2' or a local model folder.")),
    _option("device", Optional[str], typer.Option(None, "--device", help="Exact: auto | cpu | cuda.")),
    _option("dtype", str, typer.Option("float32", "--dtype", help="Exact, torch runtime: float32 | bfloat16 | float16.")),
    _option("runtime", Optional[str], typer.Option(
        None, "--runtime", help="Exact: auto | torch | int4 | llama. torch = transformers in float32 (the "
                                "reference); int4 = the GGUF on torch's int4 kernel; llama = llama.cpp (the "
                                "'llama' extra, make install-llama). auto = int4 for SmolLM2 in float32 on a CPU with bfloat16, "
                                "else torch (docs/runtimes.md).")),
]


def with_options(command: Callable) -> Callable:
    """Add the shared options to a command; it receives them as `sampler_options` and `client_options` dicts."""
    own = [p for name, p in inspect.signature(command).parameters.items()
           if name not in ("sampler_options", "client_options")]

    @functools.wraps(command)
    def wrapper(**kwargs):
        sampler = {p.name: kwargs.pop(p.name) for p in SAMPLER_OPTIONS}
        client = {p.name: kwargs.pop(p.name) for p in CLIENT_OPTIONS}
        return command(sampler_options=sampler, client_options=client, **kwargs)

    wrapper.__signature__ = inspect.Signature([*own, *SAMPLER_OPTIONS, *CLIENT_OPTIONS])
    return wrapper


def _client(prompt: str, path: str, client_options: dict, paths=NEXT_TOKEN_PATHS,
            draft_tokens: int = PathOptions.draft_tokens, risk_threshold: float = PathOptions.risk_threshold,
            memory: bool = False, remember: bool = False, tree_width: int = PathOptions.max_tree_width,
            speculative_target: str | None = None):
    from hartonomous.client import Client
    from hartonomous.errors import UserError
    from hartonomous.memory import REMEMBERED_PATHS

    check_prompt(prompt)
    if path not in paths:
        raise UserError(f"--path must be {' or '.join(paths)}, got '{path}'")
    if not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise UserError(f"--draft-tokens must be between 1 and {MAX_DRAFT_TOKENS}, got {draft_tokens}")
    if not 1 <= tree_width <= MAX_TREE_WIDTH:
        raise UserError(f"--tree-width must be between 1 and {MAX_TREE_WIDTH}, got {tree_width}")
    if speculative_target is not None:
        if speculative_target not in SPECULATIVE_TARGETS:
            raise UserError(f"--speculative-target must be {' or '.join(SPECULATIVE_TARGETS)}, "
                            f"got '{speculative_target}'")
        if path != "speculative":
            raise UserError(f"--speculative-target is for --path speculative, not {path}")
    weight = client_options.get("augment_weight")
    if weight is not None:
        if not reads_option("augment_weight", path, speculative_target):
            raise UserError(f"--augment-weight is for {option_home('augment_weight', cli=True)}, not {path}")
        if not (0.0 <= weight <= 1.0):              # false for NaN too
            raise UserError(f"--augment-weight must be in [0, 1] (for experiments; leave it out and the atom "
                            f"set's gate decides λ), got {weight}")
    if remember and not rememberable(path, speculative_target):
        what = (f"the {speculative_target} target's" if len(output_paths(path, speculative_target)) > 1
                else f"the {path} path's")
        raise UserError(f"--remember keeps only the exact model's words: use it with --path "
                        f"{' or '.join(REMEMBERED_PATHS)} ({what} output holds the store's own guesses)")
    return Client(**client_options, draft_tokens=draft_tokens, max_draft_tokens=draft_ceiling(draft_tokens),
                  risk_threshold=risk_threshold, memory=memory, remember=remember, max_tree_width=tree_width,
                  speculative_target=speculative_target or PathOptions.speculative_target)


def _default_path(prompt: str, client_options: dict) -> str:
    """The path for `generate` without --path (hartonomous.paths.default), said on stderr."""
    from hartonomous.config import get_settings
    from hartonomous.paths.default import choose

    from hartonomous.centroid import validate_history
    from hartonomous.errors import UserError

    check_prompt(prompt)                    # bad input is refused before the database is read,
    try:                                    # whichever path then reads it
        validate_history(client_options.get("history_weight"), client_options.get("history_window"))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    chosen = choose(client_options.get("atom_set"), client_options.get("model") or get_settings().model)
    print(chosen.line(), file=sys.stderr)
    return chosen.path


def _stats_line(result, runtime: str | None = None) -> str:
    t = result.timings
    rate = f"{t.tokens_per_second:.1f} tokens/s" if t.total_s > 0 else "n/a tokens/s"
    on = f"; {runtime} runtime" if runtime else ""
    return (f"[{result.path}] {len(result.token_ids)} tokens in {t.total_s:.2f} s, {rate}; "
            f"{result.state.value} ({result.finish_reason}); seed {result.seed}{on}")


def _augmented_line(stats) -> str:
    """The augmented statistics: how much the store weighed in (AugmentedStats.as_dict)."""
    s = stats.as_dict()
    mean = f"{s['mean_weight']:.3f}" if s["mean_weight"] is not None else "n/a"
    return (f"[augmented] mean λ {mean} over {s['steps']} steps; the store's most probable token picked at "
            f"{s['store_top_picked']}/{s['steps']}")


def _speculative_line(stats) -> str:
    """The speculative statistics: how much drafting helped and where the time went."""
    rate = f"{stats.acceptance_rate:.2f}" if stats.acceptance_rate is not None else "n/a"
    per_forward = f"{stats.tokens_per_forward:.2f}" if stats.tokens_per_forward is not None else "n/a"
    target = getattr(stats, "target", "exact")
    verified = "" if target == "exact" else f" (verified against the {target} path)"
    return (f"[speculative] {stats.rounds} rounds{verified}, {stats.accepted}/{stats.drafted} drafts accepted "
            f"(acceptance {rate}), {per_forward} tokens per forward; draft {stats.draft_s:.2f} s, "
            f"verify {stats.verify_s:.2f} s, decide {stats.decide_s:.2f} s")


def _verbatim(engine, result) -> list:
    """--cite: the runs of 20 or more generated tokens stored verbatim in one file."""
    from hartonomous.repository.citations import citer_for

    return citer_for(engine.backend).verbatim(result.token_ids)


def register(app: typer.Typer) -> None:
    """Add the generation commands to the CLI app."""

    @app.command("generate")
    @with_options
    def generate_cmd(
        prompt: str = typer.Argument(..., help="Text to continue."),
        path: Optional[str] = typer.Option(None, "--path", help=GENERATE_PATH_HELP),
        stream: bool = typer.Option(False, "--stream", help="Print tokens as they are made, then tokens/s."),
        draft_tokens: int = typer.Option(PathOptions.draft_tokens, "--draft-tokens",
                                         help=f"Speculative: tokens drafted in the first round, then adaptive "
                                              f"(1..{MAX_DRAFT_TOKENS})."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Seed for reproducible sampling."),
        max_new_tokens: int = typer.Option(GenerationConfig.max_new_tokens, "--max-new-tokens",
                                           help=f"Most tokens to generate (1..{MAX_NEW_TOKENS})."),
        stop: list[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
        stop_token_id: list[int] = typer.Option([], "--stop-token-id", help="Stop token id (repeatable)."),
        ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Do not stop at the EOS token."),
        in_database: bool = typer.Option(False, "--in-database",
                                         help="Spatial: run the whole loop in SQL generate_tokens."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        memory: bool = typer.Option(False, "--memory",
                                    help="Speculative: draft from the atom set's memory of past generations too; "
                                         "augmented: the store reads that memory too."),
        remember: bool = typer.Option(False, "--remember",
                                      help="Exact, speculative: remember this generation in the atom set's "
                                           "memory (written as the database owner; only the exact model's words "
                                           "are remembered, so not with spatial or hybrid, and only under sampler "
                                           "settings the set's memory policy admits: by default greedy and the "
                                           "sampler's defaults, no --ignore-eos; stderr says whether it was)."),
        tree_width: int = typer.Option(PathOptions.max_tree_width, "--tree-width",
                                       help="Speculative: let rounds draft trees of up to this many branches "
                                            "(1 = chains)."),
        speculative_target: Optional[str] = typer.Option(
            None, "--speculative-target",
            help="Speculative: verify the drafts against exact (the default: the exact path's output) or "
                 "augmented (the augmented path's output, chains only; needs what --path augmented needs; "
                 "never remembered)."),
        risk_threshold: float = typer.Option(PathOptions.risk_threshold, "--risk-threshold",
                                             help="Hybrid: spatial step when the predicted risk is below this "
                                                  "(0: always exact; inf: always spatial)."),
        adaptive: bool = typer.Option(GenerationConfig.adaptive, "--adaptive",
                                      help="Risk-scored adaptive sampling (needs an atom set with a risk predictor)."),
        standard_p: float = typer.Option(GenerationConfig.standard_p, "--standard-p", help="Adaptive: low-risk top-p."),
        explore_p: float = typer.Option(GenerationConfig.explore_p, "--explore-p", help="Adaptive: medium-risk top-p."),
        explore_temp: float = typer.Option(GenerationConfig.explore_temp, "--explore-temp",
                                           help="Adaptive: medium-risk temperature."),
        cautious_mode: str = typer.Option(GenerationConfig.cautious_mode, "--cautious-mode",
                                          help="Adaptive, high risk: flatten | signal | abstain."),
        explore_risk: float = typer.Option(GenerationConfig.explore_risk, "--explore-risk",
                                           help="Adaptive: risk from which a step explores (0..1)."),
        cautious_risk: float = typer.Option(GenerationConfig.cautious_risk, "--cautious-risk",
                                            help="Adaptive: risk from which a step is cautious (0..1)."),
        cite: bool = typer.Option(False, "--cite",
                                  help="After the output, the file:line (and license) each token the store picked "
                                       "came from, or the remembered generation; flags any run of 20 or more "
                                       "generated tokens stored verbatim in one file, with its license. Needs a "
                                       "path that reads an atom set; costs a database call per cited token."),
        threads: Optional[int] = typer.Option(None, "--threads",
                                              help="Threads for the exact model's forwards, 1 to the cores. "
                                                   "Default: the cores less the other processes running now."),
        sampler_options: dict | None = None,
        client_options: dict | None = None,
    ) -> None:
        """Continue PROMPT with one of the paths (--path; hartonomous/paths declares them)."""
        from hartonomous.client import make_config
        from hartonomous.runtimes.threads import ThreadPolicy

        ThreadPolicy(threads).apply()           # a count outside 1..cores: one line, before anything loads

        config = make_config(max_new_tokens=max_new_tokens, seed=seed, stop_strings=tuple(stop),
                             stop_token_ids=tuple(stop_token_id), stop_at_eos=not ignore_eos, adaptive=adaptive,
                             standard_p=standard_p, explore_p=explore_p, explore_temp=explore_temp,
                             cautious_mode=cautious_mode, explore_risk=explore_risk, cautious_risk=cautious_risk,
                             cite=cite, **sampler_options)
        if path is None:
            path = "spatial" if in_database else _default_path(prompt, client_options)   # the SQL loop is spatial
        with _client(prompt, path, client_options, GENERATE_PATHS, draft_tokens,
                     risk_threshold, memory, remember, tree_width, speculative_target) as client:
            engine = client.engine(path, in_database=in_database)
            session = engine.stream(prompt, config)
            events = []
            if stream and not as_json:
                try:
                    for event in session.events():
                        events.append(event)
                        sys.stdout.write(event.text)
                        sys.stdout.flush()
                except KeyboardInterrupt:
                    session.cancel()
                    raise
                sys.stdout.write(session.tail + "\n")
                result = session.result
            else:
                events = list(session.events())
                result = session.result
                if not as_json:
                    print(result.text)
            runtime = client.exact_runtime
            runs = _verbatim(engine, result) if cite else []
        if as_json:
            cited = {"citations": [[c.as_dict() for c in e.citations or ()] for e in events],
                     "verbatim": [r.as_dict() for r in runs]} if cite else {}
            print(json.dumps({**result_json(result), "runtime": runtime, **cited}, indent=2))
        else:
            if cite:
                from hartonomous.repository.citations import report_lines

                print("\n".join(report_lines(events, runs, engine.tokenizer)))
            print(_stats_line(result, runtime), file=sys.stderr)
            if result.path == "hybrid":
                s = result.stats
                print(f"[hybrid] {s.exact_steps}/{s.steps} steps from the exact model (risk threshold {s.threshold:g})",
                      file=sys.stderr)
            elif result.path == "augmented":
                print(_augmented_line(result.stats), file=sys.stderr)
            elif result.stats is not None:
                print(_speculative_line(result.stats), file=sys.stderr)
            if result.memory is not None:            # --remember: what the set's memory did with it
                print(f"[memory] {result.memory.line()}", file=sys.stderr)

    @app.command("next-token")
    @with_options
    def next_token_cmd(
        prompt: str = typer.Argument(..., help="Context text."),
        path: str = typer.Option(DEFAULT_PATH, "--path", help=PATH_HELP),
        limit: int = typer.Option(20, "--limit", help="Rows to show in the table (JSON has all)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        sampler_options: dict | None = None,
        client_options: dict | None = None,
    ) -> None:
        """Show the next-token distribution after PROMPT (after the sampler), as a table or JSON."""
        from rich.console import Console
        from rich.table import Table

        with _client(prompt, path, client_options, NEXT_TOKEN_PATHS) as client:
            rows = client.next_token(prompt, path, **sampler_options)
        if as_json:
            print(json.dumps([r.__dict__ for r in rows], indent=2))
            return
        table = Table(title=f"next token after {prompt!r} ({path})")
        for column in ("rank", "token_id", "text", "probability", "cumulative"):
            table.add_column(column, justify="left" if column == "text" else "right")
        for rank, r in enumerate(rows[:max(limit, 0)], 1):
            table.add_row(str(rank), str(r.token_id), repr(r.text), f"{r.probability:.4f}",
                          f"{r.cumulative_probability:.4f}")
        Console().print(table)
        if len(rows) > limit:
            print(f"({len(rows) - limit} more rows; use --limit or --json)", file=sys.stderr)


def result_json(result) -> dict:
    t = result.timings
    return {"path": result.path, "text": result.text, "token_ids": result.token_ids, "state": result.state.value,
            "finish_reason": result.finish_reason, "seed": result.seed, "prompt_ids": result.prompt_ids,
            "timings": {"prefill_s": t.prefill_s, "total_s": t.total_s, "per_token_s": t.per_token_s,
                        "tokens_per_second": t.tokens_per_second},
            "stats": result.stats.as_dict() if result.stats is not None else None,
            "memory": result.memory.as_dict() if result.memory is not None else None}
