"""The search tables of ggml's grid encoders (``iq2xs_init_impl`` of ggml-quants.c), for the four
grids it serves: IQ2_XXS (256 entries), IQ2_XS (512), IQ2_S (1024) and IQ1_S / IQ1_M (2048).
Plain numpy, no numba: ``tables(fmt)`` makes them once per grid (on first use, then cached) and
the encoders read them as constants.

Every grid point is 8 levels ``l_j`` (0..2) packed 2 bits each into a 16-bit code
``u = sum_j l_j << 2j`` (ggml's ``kgrid_2bit_256/512/1024`` and ``kgrid_1bit_2048``).  Those code
tables are not copied: they are the decode grids of ``numba_qk.formats.iq_grids`` read back
(IQ2 grid bytes 8, 25, 43 -> l = 0, 1, 2; IQ1 grid bytes -1, 0, 1 -> l = 0, 1, 2), which gives
ggml's tables entry for entry (checked against ggml-quants.c of the llama.cpp 0.3.36 vendor tree,
and by a digest in tests/iq/test_iq2_encode.py).  From them, as ggml does:

* ``grid``  int8 [n, 8]: ``2 l_j + 1`` (1, 3, 5; ggml's ``kgrid_q2xs``, one uint64 per entry).
* ``kmap``  int32 [43692]: for a code ``u`` on the grid, its entry index; for every other
  ``u < 43692`` (ggml's ``kmap_size``), ``-(offset + 1)`` where ``neighbours[offset]`` starts
  its neighbour list.
* ``neighbours`` uint16: per off-grid code, in increasing ``u``: the count ``m``, then the ``m``
  entries nearest to the point ``2 l_j + 1`` (levels of ``u``, 0..3) in squared integer
  distance ``d2``, those at the ``nwant`` smallest distinct distances (``nwant`` = 2 for IQ2_XXS
  and IQ2_XS, 1 for IQ2_S, 3 for IQ1), ordered by ``(d2, entry index)`` -- ggml's ``qsort`` with
  ``iq2_compare_func``, a total order, so the lists are unique (its OpenMP passes only split the
  work; the result does not depend on them).

Deterministic: integer arithmetic and a total order only; the same tables on every machine.
"""

from __future__ import annotations

import functools

import numpy as np

from numba_qk.formats import iq as _iq
from numba_qk.formats import iq_grids as _g

__all__ = ["KMAP_SIZE", "GridTables", "tables", "grid_codes"]

KMAP_SIZE = 43692          # ggml's kmap_size (codes 0 .. 0xAAAB)

# format -> (decode grid, byte -> level, nwant); IQ1_S and IQ1_M share one table (ggml's gindex 2)
_SPEC = {
    _iq.iq2_xxs: ("IQ2XXS_GRID", {8: 0, 25: 1, 43: 2}, 2),
    _iq.iq2_xs: ("IQ2XS_GRID", {8: 0, 25: 1, 43: 2}, 2),
    _iq.iq2_s: ("IQ2S_GRID", {8: 0, 25: 1, 43: 2}, 1),
    _iq.iq1_s: ("IQ1S_GRID", {0xFF: 0, 0: 1, 1: 2}, 3),
    _iq.iq1_m: ("IQ1S_GRID", {0xFF: 0, 0: 1, 1: 2}, 3),
}


class GridTables:
    """One grid's search tables (see the module docstring): ``grid`` int8 [n, 8], ``kmap``
    int32 [KMAP_SIZE], ``neighbours`` uint16, ``codes`` int32 [n] (ggml's ``kgrid_*``), and
    ``nwant``."""

    __slots__ = ("grid", "kmap", "neighbours", "codes", "nwant")

    def __init__(self, grid, kmap, neighbours, codes, nwant):
        self.grid, self.kmap, self.neighbours, self.codes = grid, kmap, neighbours, codes
        self.nwant = nwant


def grid_codes(name: str, levels: dict) -> np.ndarray:
    """ggml's ``kgrid_*`` code table (int32 [n]) of the decode grid ``iq_grids.<name>``."""
    t = np.array(getattr(_g, name), np.uint64)
    lut = np.full(256, -1, np.int64)
    for byte, level in levels.items():
        lut[byte] = level
    lv = np.stack([lut[((t >> np.uint64(8 * j)) & np.uint64(0xFF)).astype(np.int64)]
                   for j in range(8)], axis=1)
    if (lv < 0).any():
        raise AssertionError(f"grid_search: {name} holds a byte outside {sorted(levels)}")
    return (lv << (2 * np.arange(8))).sum(axis=1).astype(np.int32)


def _points(codes: np.ndarray) -> np.ndarray:
    """``2 l_j + 1`` (int32 [len(codes), 8]) of 16-bit codes."""
    return 2 * ((codes[:, None].astype(np.int32) >> (2 * np.arange(8, dtype=np.int32))) & 3) + 1


def _build(codes: np.ndarray, nwant: int) -> tuple:
    n = codes.shape[0]
    grid = _points(codes)
    kmap = np.full(KMAP_SIZE, -1, np.int32)
    kmap[codes] = np.arange(n, dtype=np.int32)
    off = np.flatnonzero(kmap < 0).astype(np.int32)
    gf = grid.astype(np.float64)
    g2 = (grid * grid).sum(axis=1)
    rows, cols, dist = [], [], []
    for start in range(0, off.shape[0], 2048):
        p = _points(off[start:start + 2048])
        # squared distances, exact (small integers; the product in float64 is exact)
        d2 = (p * p).sum(axis=1)[:, None] + g2[None, :] - (2 * (p @ gf.T)).astype(np.int32)
        thr = d2.min(axis=1)            # the nwant-th smallest distinct distance of each row
        for _ in range(nwant - 1):
            above = np.where(d2 > thr[:, None], d2, np.iinfo(np.int32).max).min(axis=1)
            thr = np.where(above == np.iinfo(np.int32).max, thr, above)
        r, c = np.nonzero(d2 <= thr[:, None])
        rows.append(r + start)
        cols.append(c)
        dist.append(d2[r, c])
    rows, cols, dist = np.concatenate(rows), np.concatenate(cols), np.concatenate(dist)
    order = np.lexsort((cols, dist, rows))      # per code: by (d2, entry index)
    rows, cols = rows[order], cols[order]
    counts = np.bincount(rows, minlength=off.shape[0])
    offsets = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])
    neighbours = np.empty(int((counts + 1).sum()), np.uint16)
    neighbours[offsets] = counts
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    neighbours[offsets[rows] + 1 + (np.arange(rows.shape[0]) - first[rows])] = cols
    kmap[off] = -(offsets + 1).astype(np.int32)
    return grid.astype(np.int8), kmap, neighbours


@functools.lru_cache(maxsize=None)
def _tables(name: str) -> GridTables:
    levels, nwant = next((lv, nw) for nm, lv, nw in _SPEC.values() if nm == name)
    codes = grid_codes(name, levels)
    grid, kmap, neighbours = _build(codes, nwant)
    for a in (grid, kmap, neighbours, codes):
        a.setflags(write=False)
    return GridTables(grid, kmap, neighbours, codes, nwant)


def tables(fmt) -> GridTables:
    """The search tables of grid format ``fmt`` (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M; IQ1_S and
    IQ1_M share theirs), made on first use."""
    return _tables(_SPEC[fmt][0])
