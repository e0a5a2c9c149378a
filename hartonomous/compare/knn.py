"""The full-dimensional KNN baseline's search: the set's keys held in NumPy, pgvector's order kept.

A brute-force `ORDER BY key <-> q, atom_id LIMIT K` per position scans every key in SQL (no vector
index by design) and took minutes per thousand positions. Here the keys are read once (binary COPY),
the positions' queries are batched into float64 matrix products, and only the atoms that can be
among pgvector's K nearest (within a bound on float32 rounding of the K-th distance) go back to SQL,
which ranks them with the same `key <-> q, atom_id` as the full scan: the same neighbours, in the
same order, at the same distances.
"""

from __future__ import annotations

import struct

import numpy as np
import psycopg
from psycopg import sql

F32_EPS = 2.0 ** -24     # float32 unit roundoff
F64_EPS = 2.0 ** -53
BATCH_ELEMENTS = 1 << 24  # queries x keys per distance block (128 MiB of float64)

# The full scan's ordering (hartonomous.compare.spatial.KNN_KEYS), on the candidates only.
RANK_CANDIDATES = (
    "SELECT token_id, weight, key <-> %s::vector AS distance FROM atoms "
    "WHERE atom_set_id = %s AND atom_id = ANY(%s) AND key IS NOT NULL ORDER BY key <-> %s::vector, atom_id LIMIT %s"
)

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"


def vector_literal(values: np.ndarray) -> str:
    """The query as pgvector text (7 significant digits, as the SQL path has always sent it)."""
    return "[" + ",".join(f"{float(v):.7g}" for v in values) + "]"


def literal_values(literal: str) -> np.ndarray:
    """The float32 vector pgvector parses from `literal`."""
    return np.asarray([float(v) for v in literal[1:-1].split(",")], dtype=np.float32)


class KeySearch:
    """One atom set's keys, searched exactly; `candidates` never misses one of pgvector's K nearest."""

    def __init__(self, atom_ids: np.ndarray, keys: np.ndarray):
        self.atom_ids = np.asarray(atom_ids, dtype=np.int64)
        self.keys = np.ascontiguousarray(keys, dtype=np.float64)   # float32 values, exact in float64
        self.norms = np.einsum("ij,ij->i", self.keys, self.keys)
        self.max_norm = float(self.norms.max()) if len(self.norms) else 0.0

    def __len__(self) -> int:
        return len(self.atom_ids)

    @property
    def dim(self) -> int:
        return int(self.keys.shape[1])

    def candidates(self, queries: np.ndarray, k: int) -> list[np.ndarray]:
        """Per query (float32 rows), the atom ids whose pgvector distance can be within the K nearest.

        pgvector sums (q_i - y_i)^2 in float32 (in an order the compiler picks), so its squared
        distance is within a relative (dim + 4) * 2^-24 of the real one; the float64 distances here
        are within 4 (dim + 2) * 2^-53 (|q|^2 + max |y|^2). A query parsed by strtof may differ from
        float(...) -> float32 by one ulp per component, at most 2^-23 |q| in distance. Every atom
        whose distance can reach the K-th smallest under these bounds is kept (a factor 2 to spare).
        """
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32)).astype(np.float64)
        n = len(self)
        if n == 0:
            return [np.empty(0, dtype=np.int64) for _ in queries]
        k = min(int(k), n)
        delta = 2.0 * (self.dim + 4) * F32_EPS
        step = max(1, BATCH_ELEMENTS // n)
        out: list[np.ndarray] = []
        for start in range(0, len(queries), step):
            q = queries[start:start + step]
            qn = np.einsum("ij,ij->i", q, q)
            d2 = q @ self.keys.T
            d2 *= -2.0
            d2 += qn[:, None]
            d2 += self.norms[None, :]
            kth = np.partition(d2, k - 1, axis=1)[:, k - 1]
            err = 8.0 * (self.dim + 2) * F64_EPS * (qn + self.max_norm)     # float64 error, doubled
            shift = 2.0 * 2.0 * F32_EPS * np.sqrt(qn)                      # the query's parse, doubled
            reach = (1.0 + delta) * (np.sqrt(np.maximum(kth, 0.0) + err) + shift)
            limit = (reach / (1.0 - delta) + shift) ** 2 + err
            out.extend(self.atom_ids[np.flatnonzero(row <= lim)] for row, lim in zip(d2, limit))
        return out


def load_keys(conn: psycopg.Connection, atom_set_id: int) -> KeySearch:
    """The set's (atom_id, key) rows, in one binary COPY (4 bytes a dimension on the wire)."""
    query = sql.SQL("COPY (SELECT atom_id, key FROM atoms WHERE atom_set_id = {} AND key IS NOT NULL) "
                    "TO STDOUT (FORMAT BINARY)").format(sql.Literal(int(atom_set_id)))
    data = bytearray()
    with conn.cursor() as cur, cur.copy(query) as copy:
        for chunk in copy:
            data += chunk
    return KeySearch(*parse_copy(bytes(data)))


def parse_copy(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(atom ids, float32 keys) from COPY (atom_id bigint, key vector) TO STDOUT (FORMAT BINARY)."""
    if not data.startswith(_COPY_SIGNATURE):
        raise ValueError("not a binary COPY stream")
    (extension,) = struct.unpack_from(">i", data, len(_COPY_SIGNATURE) + 4)
    body = memoryview(data)[len(_COPY_SIGNATURE) + 8 + extension: len(data) - 2]   # less the -1 trailer
    if len(body) == 0:
        return np.empty(0, dtype=np.int64), np.empty((0, 0), dtype=np.float32)
    (dim,) = struct.unpack_from(">h", body, 2 + 4 + 8 + 4)
    record = np.dtype([("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"), ("key_len", ">i4"),
                       ("dim", ">i2"), ("unused", ">i2"), ("key", ">f4", (dim,))])
    if len(body) % record.itemsize:
        raise ValueError("the keys do not all have the same dimension")
    rows = np.frombuffer(body, dtype=record)
    if not ((rows["fields"] == 2).all() and (rows["id_len"] == 8).all() and (rows["dim"] == dim).all()
            and (rows["key_len"] == 4 + 4 * dim).all()):
        raise ValueError("the keys do not all have the same dimension")
    return rows["id"].astype(np.int64), rows["key"].astype(np.float32)


def ranked(conn: psycopg.Connection, literal: str, atom_set_id: int, candidates: np.ndarray,
           k: int) -> list[tuple]:
    """(token_id, weight, distance) of the K nearest among `candidates`, in the full scan's order."""
    return conn.execute(RANK_CANDIDATES, (literal, atom_set_id, candidates.tolist(), literal, k),
                        prepare=True).fetchall()
