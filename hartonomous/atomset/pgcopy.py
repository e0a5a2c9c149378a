"""PostgreSQL binary COPY payloads built with NumPy (no per-row Python for fixed-width rows).

Geometry travels as EWKB (PostGIS's binary I/O format) and pgvector's `vector` as its binary
format (int16 dim, int16 unused, float4 values, big-endian).
"""

from __future__ import annotations

import struct

import numpy as np

HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
TRAILER = struct.pack(">h", -1)
EWKB_POINTZ = 0x80000001  # wkbPoint with the EWKB Z flag, SRID 0


def _fields(columns: list[tuple[str, np.ndarray]]) -> tuple[np.dtype, list]:
    descr: list = [("nfields", ">i2")]
    fill: list = []
    for i, (kind, values) in enumerate(columns):
        if kind == "int2":
            descr += [(f"len{i}", ">i4"), (f"v{i}", ">i2")]
            fill.append((i, kind, 2, values))
        elif kind == "int4":
            descr += [(f"len{i}", ">i4"), (f"v{i}", ">i4")]
            fill.append((i, kind, 4, values))
        elif kind == "int8":
            descr += [(f"len{i}", ">i4"), (f"v{i}", ">i8")]
            fill.append((i, kind, 8, values))
        elif kind == "float8":
            descr += [(f"len{i}", ">i4"), (f"v{i}", ">f8")]
            fill.append((i, kind, 8, values))
        elif kind == "pointz":
            descr += [(f"len{i}", ">i4"), (f"bo{i}", "u1"), (f"t{i}", "<u4"), (f"v{i}", "<f8", (3,))]
            fill.append((i, kind, 29, values))
        elif kind == "vector":
            dim = values.shape[1]
            descr += [(f"len{i}", ">i4"), (f"dim{i}", ">i2"), (f"pad{i}", ">i2"), (f"v{i}", ">f4", (dim,))]
            fill.append((i, kind, 4 + 4 * dim, values))
        else:
            raise ValueError(f"unsupported column kind {kind}")
    return np.dtype(descr), fill


def fixed_width_payload(columns: list[tuple[str, np.ndarray]], header: bool = True,
                        trailer: bool = True) -> bytes:
    """Binary COPY bytes for rows whose columns are all fixed-width and non-null."""
    n = len(columns[0][1])
    dtype, fill = _fields(columns)
    rows = np.empty(n, dtype=dtype)
    rows["nfields"] = len(columns)
    for i, kind, size, values in fill:
        rows[f"len{i}"] = size
        if kind == "pointz":
            rows[f"bo{i}"] = 1
            rows[f"t{i}"] = EWKB_POINTZ
        elif kind == "vector":
            rows[f"dim{i}"] = values.shape[1]
            rows[f"pad{i}"] = 0
        rows[f"v{i}"] = values
    return (HEADER if header else b"") + rows.tobytes() + (TRAILER if trailer else b"")


def ewkb_pointz(x: float, y: float, z: float) -> bytes:
    return struct.pack("<BI3d", 1, EWKB_POINTZ, x, y, z)


def vector_bytes(values: np.ndarray) -> bytes:
    values = np.asarray(values, dtype=">f4")
    return struct.pack(">hh", values.shape[0], 0) + values.tobytes()
