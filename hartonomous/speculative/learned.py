"""What drafting learned, carried across the generations of one server or one Client.

A speculative run's draft policy (hartonomous/speculative/decoding.py, draft_cost.py) learns the
drafter's acceptance, its draft-call time and (legacy schedule) a draft length as it goes. Made
fresh per generation, every request's first rounds would draft blind. DraftLearning keeps the
policy's learned state of the last run that finished, per kind of request, and a new run of the
same kind starts from it.

A kind is: the atom set, the verifying target (exact | augmented), whether the drafter reads the
set's memory, the policy (cost-shaped or the legacy schedule) and its widest tree, greedy or
sampled, a coarse prompt-length bucket (PROMPT_BUCKETS), and, with the memory, whether this same
prompt was asked before here (its second asking drafts from the memory of the first, so it learns
apart from first askings).

Carried state changes speed, never tokens: at T = 0 every kept token is the exact argmax whatever
the draft length, and at T > 0 the policies that may be warmed decide every position by a rule that
does not depend on the draft length (hartonomous/speculative/decoding.py); a legacy policy that
pauses drafting at T > 0 is not warmed (its plain steps draw another sample).

Thread-safe (one lock; the server's model executor runs requests concurrently) and bounded: at
most MAX_KINDS kinds and MAX_PROMPTS remembered prompt digests, the least recently used dropped.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_KINDS = 256              # kinds kept (least recently used dropped)
MAX_PROMPTS = 4096           # prompt digests kept for "asked before" (16 bytes each)
PROMPT_BUCKETS = (64, 256, 1024, 4096)   # prompt tokens: < 64, < 256, < 1024, < 4096, longer


@dataclass(frozen=True)
class DraftKind:
    """What a run's learned acceptance is filed under (see the module docstring)."""

    atom_set: str
    target: str
    memory: bool
    policy: str
    max_width: int
    sampled: bool
    prompt_bucket: int       # index into PROMPT_BUCKETS (len(PROMPT_BUCKETS): longer than the last)
    repeated: bool           # with the memory: this prompt was asked before here

    def describe(self) -> str:
        bucket = (f"<{PROMPT_BUCKETS[self.prompt_bucket]}" if self.prompt_bucket < len(PROMPT_BUCKETS)
                  else f">={PROMPT_BUCKETS[-1]}")
        return (f"{self.atom_set}/{self.target}{'+memory' if self.memory else ''}/{self.policy}"
                f"{f'/w{self.max_width}' if self.max_width > 1 else ''}/{'sampled' if self.sampled else 'greedy'}"
                f"/prompt{bucket}{'/repeated' if self.repeated else ''}")


def prompt_bucket(length: int) -> int:
    """The coarse length class of a prompt of `length` tokens."""
    return next((i for i, bound in enumerate(PROMPT_BUCKETS) if length < bound), len(PROMPT_BUCKETS))


def _digest(atom_set: str, prompt_ids: list[int]) -> bytes:
    data = ",".join(map(str, prompt_ids)).encode()
    return hashlib.blake2b(data, digest_size=16, person=atom_set.encode()[:16]).digest()


class DraftLearning:
    """The draft policies' learned state per DraftKind, shared by the runs of one server or Client."""

    def __init__(self, max_kinds: int = MAX_KINDS, max_prompts: int = MAX_PROMPTS):
        if max_kinds < 1 or max_prompts < 1:
            raise ValueError("max_kinds and max_prompts must be at least 1")
        self.max_kinds, self.max_prompts = max_kinds, max_prompts
        self._lock = threading.Lock()
        self._learned: OrderedDict[DraftKind, dict] = OrderedDict()
        self._prompts: OrderedDict[bytes, None] = OrderedDict()

    def kind(self, *, atom_set: str, target: str, memory: bool, policy: str, max_width: int, sampled: bool,
             prompt_ids: list[int]) -> DraftKind:
        """The kind of a run about to start on `prompt_ids`."""
        repeated = False
        if memory:
            with self._lock:
                repeated = _digest(atom_set, prompt_ids) in self._prompts
        return DraftKind(atom_set, target, bool(memory), policy, max_width, bool(sampled),
                         prompt_bucket(len(prompt_ids)), repeated)

    def recall(self, kind: DraftKind) -> dict | None:
        """The learned state the last finished run of `kind` left (None: nothing yet)."""
        with self._lock:
            state = self._learned.get(kind)
            if state is not None:
                self._learned.move_to_end(kind)
            return state

    def keep(self, kind: DraftKind, state: dict, prompt_ids: list[int] | None = None) -> None:
        """File a finished run's learned state (an immutable snapshot) under `kind`; with the memory,
        its prompt counts as asked before from now on."""
        with self._lock:
            self._learned[kind] = state
            self._learned.move_to_end(kind)
            while len(self._learned) > self.max_kinds:
                self._learned.popitem(last=False)
            if kind.memory and prompt_ids is not None:
                digest = _digest(kind.atom_set, prompt_ids)
                self._prompts[digest] = None
                self._prompts.move_to_end(digest)
                while len(self._prompts) > self.max_prompts:
                    self._prompts.popitem(last=False)

    def as_dict(self) -> dict:
        """What is carried now (for statistics): the kinds and how many judged draft tokens each holds."""
        with self._lock:
            return {"kinds": {k.describe(): {"judged": len(s.get("recent", ())), **({"k": s["k"]} if "k" in s else {})}
                              for k, s in self._learned.items()},
                    "prompts": len(self._prompts)}

    def __len__(self) -> int:
        with self._lock:
            return len(self._learned)
