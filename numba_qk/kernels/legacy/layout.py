"""Layout tables of ggml's legacy formats, read from the schemas' fields at import (no numba).

Shared by the portable kernels (``legacy.py``) and the SIMD decoders (``_simd.py``).  A format's
*code* is its position in ``FORMATS``; every table is indexed by code (-1: no such field).
"""

from numba_qk.formats import activation_format
from numba_qk.formats import legacy as _declared

# Format codes: kernels are selected by these small ints (the position in FORMATS).  Every byte
# offset below is read from the schema's fields at import, never retyped.
FORMATS = _declared.FORMATS
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = range(len(FORMATS))
CODES = {fmt: code for code, fmt in enumerate(FORMATS)}


def _field_at(name):
    """Byte offset of field ``name`` in each format (-1 where the format has no such field)."""
    return tuple(next((f.start for f in fmt.fields if f.name == name), -1) for fmt in FORMATS)


D_AT = _field_at("d")     # f16 scale
M_AT = _field_at("m")     # f16 min (Q4_1, Q5_1)
S_AT = _field_at("s")     # f16 d * sum(q) (Q8_1)
QH_AT = _field_at("qh")   # u32 of fifth bits (Q5_0, Q5_1)
QS_AT = _field_at("qs")   # quants: nibbles, or int8 (Q8_0, Q8_1)


def _paired(fmt):
    try:
        return activation_format(fmt)
    except TypeError:  # an activation format: no dot of its own
        return None


# Weight formats (those with a declared activation pairing) and, per format, where the paired
# activation's int8 quants start (-1: not a weight format).
WEIGHT_FORMATS = tuple(fmt for fmt in FORMATS if _paired(fmt) is not None)


def _paired_at(table):
    return tuple(table[CODES[_paired(fmt)]] if _paired(fmt) else -1 for fmt in FORMATS)


X_D_AT, X_S_AT, X_QS_AT = _paired_at(D_AT), _paired_at(S_AT), _paired_at(QS_AT)
# Unsigned quants of a format without a min are centred: the dot multiplies q - 2**(bits - 1)
# (q - 8 for Q4_0, q - 16 for Q5_0); the int8 and min formats use q as stored.
ZERO = tuple(0 if (fmt.field("qs").signed or M_AT[c] >= 0)
              else 1 << (fmt.field("qs").bits + (1 if QH_AT[c] >= 0 else 0) - 1)
              for c, fmt in enumerate(FORMATS))
