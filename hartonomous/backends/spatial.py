"""The spatial backend: SQL `next_token` per step on one connection.

Per step, `next_token` runs as a prepared statement (psycopg `prepare=True`) and returns the
distribution after the shared sampler; the engine picks the token with
`seeded_uniform(seed, step)`, exactly as the database's `generate_tokens` does, so the two modes
give the same ids for the same seed. next_token takes ids, not a centroid, so the context sent
each step is cut to what the centroid and the history atoms read (the centroid window plus the
history window) when no repetition penalty needs the rest: the work per step then stays bounded
as the text grows, with identical results.
The whole loop in one `generate_tokens` call is `hartonomous.backends.in_database.InDatabaseBackend`.

One call per step when the step's signals are wanted too (the hybrid path, adaptive sampling,
`signals=True`): on the native kernel `signals` fetches the step's raw token logits with its
signals (SQL ht_step_logits) and `distribution` applies the shared sampler to those logits here
(hartonomous.sampling, the rules the SQL port is tested against), instead of a second database
call that would find the same candidates again. On the PL/pgSQL path the two calls remain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
import torch

from hartonomous import sqlcalls
from hartonomous.atomset import AtomSet, load_atom_set, tokenizer_for
from hartonomous.backends.base import Distribution
from hartonomous.errors import UserError
from hartonomous.generation_config import SamplerArgs
from hartonomous.sampling import next_token_rows
from hartonomous.signals import StepSignals
from hartonomous.sqlcalls import SpatialArgs


@dataclass
class SpatialState:
    ids: list[int]
    # The current step's raw logits (token ids ascending, logits) when `signals` fetched them.
    logits: tuple[list[int], list[float]] | None = field(default=None, repr=False)


def sample_logits(token_ids: list[int], logits: list[float], context: list[int], sampler: SamplerArgs) -> Distribution:
    """next_token's rows from a step's raw logits, by the shared sampler, over the candidates only
    (token ids ascend, so index order is id order and every tie breaks as in SQL)."""
    if not token_ids:
        return Distribution([], [])
    index = {t: i for i, t in enumerate(token_ids)}
    rows = next_token_rows(torch.tensor(logits, dtype=torch.float64), [index[t] for t in set(context) if t in index],
                           temperature=sampler.temperature, top_k=sampler.top_k, top_p=sampler.top_p,
                           repetition_penalty=sampler.repetition_penalty)
    return Distribution([token_ids[i] for i, _, _ in rows], [p for _, p, _ in rows])


class SpatialBackend:
    """Next-token distributions from PostGIS; one connection, prepared statements."""

    name = "spatial"

    def __init__(self, conn: psycopg.Connection, atom_set: str | None = None, *, tokenizer=None,
                 search_radius: float | None = None, max_neighbors: int = 100,
                 history_weight: float | None = None, history_window: int | None = None,
                 owns_connection: bool = False, memory: bool = False):
        self.spatial = SpatialArgs(search_radius, max_neighbors, history_weight, history_window)
        self.memory = bool(memory)     # next_token reads the set's memory of past generations too
        self.conn = conn
        self.owns_connection = owns_connection
        self.atom_set: AtomSet = load_atom_set(conn, atom_set)
        self.tokenizer = tokenizer if tokenizer is not None else tokenizer_for(self.atom_set)
        # ht_step_logits is there (one call per step; the C kernel has every kernel) and reads the
        # stored atoms only: with the memory, distributions come from next_token
        self.native = sqlcalls.kernel(conn) == "native" and not self.memory

    @classmethod
    def connect(cls, url: str, atom_set: str | None = None, **kwargs) -> "SpatialBackend":
        from hartonomous.db.connection import connect

        conn = connect(url, autocommit=True)
        try:
            return cls(conn, atom_set, owns_connection=True, **kwargs)
        except BaseException:
            conn.close()
            raise

    @property
    def atom_set_name(self) -> str:
        """The name of the atom set this backend reads."""
        return self.atom_set.name

    def eos_token_ids(self) -> set[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return set() if eos is None else {int(eos)}

    def start(self, prompt_ids: list[int]) -> SpatialState:
        if not prompt_ids:
            raise UserError("the prompt is empty; give at least one token of text")
        return SpatialState([int(i) for i in prompt_ids])

    def distribution(self, state: SpatialState, sampler: SamplerArgs) -> Distribution:
        if state.logits is not None:                     # fetched with this step's signals
            return sample_logits(*state.logits, state.ids, sampler)
        rows = sqlcalls.next_token(self.conn, self.context_for(state, sampler), sampler, self.spatial, self.atom_set.name,
                                   memory=self.memory)
        return Distribution([r[0] for r in rows], [r[1] for r in rows])

    def signals(self, state: SpatialState) -> StepSignals:
        """The step's signals and predicted risk (sampler-independent); on the native kernel the
        step's raw logits come with them and are kept for `distribution` (one call per step).
        The signals are the stored atoms' only, with or without the memory."""
        if self.native:
            ids, logits, signals = sqlcalls.step_logits(self.conn, self.context_for(state, None), self.spatial,
                                                        self.atom_set.name)
            state.logits = (ids, logits)
            return signals
        return sqlcalls.next_token_signals(self.conn, self.context_for(state, None), self.spatial, self.atom_set.name)

    def advance(self, state: SpatialState, token_id: int) -> None:
        state.ids.append(int(token_id))
        state.logits = None

    def close(self) -> None:
        if self.owns_connection:
            self.conn.close()

    # -- helpers -------------------------------------------------------------------------

    def history_reach(self) -> int:
        """How many earlier positions become history atoms (0 when history is off)."""
        weight = self.spatial.history_weight
        weight = self.atom_set.history_weight if weight is None else weight
        reach = self.spatial.history_window
        reach = self.atom_set.history_window if reach is None else reach
        return reach if weight > 0 else 0

    def context_for(self, state: SpatialState, sampler: SamplerArgs | None) -> list[int]:
        """The ids next_token needs, so the work per step stays bounded as the text grows.

        On the native kernel with a set of the rows layout, the whole context: next_token's and
        ht_step_logits' C steps keep, per session, the keys of the contexts they served
        (ext/hartonomous_kernel, docs/design.md "Where a generation's state lives") and compute
        only the new token's, so a context that grows by one token costs one key. Elsewhere (the
        PL/pgSQL path, the tiles layout, which keep no state), with a centroid window w and
        history atoms over the last H positions, the last H + w ids give exactly the same keys and
        atoms as the whole context; a repetition penalty reads every id, and a set without a
        window averages them all.
        """
        if self.native and self.atom_set.layout != "tiles":
            return state.ids    # the C step (next_token, ht_step_logits): the session extends its kept keys
        window = self.atom_set.centroid_window
        needed = None if window is None else window + self.history_reach()
        penalty = 1 if sampler is None else sampler.repetition_penalty      # None: no penalty reads the ids
        if needed and penalty == 1 and len(state.ids) > needed:
            return state.ids[-needed:]
        return state.ids

