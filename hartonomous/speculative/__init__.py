"""Speculative decoding: the database drafts, the exact model verifies.

`decoding` is the backend (chains and trees, acceptance, KV rollback), `draft_cost` the measured
forward costs that shape each round's draft, `learned` what the draft policies learned, carried
to a server's or a Client's next runs of the same kind. The memory of past generations the drafter reads
serves every path, so it lives beside them (hartonomous/memory.py).
"""
