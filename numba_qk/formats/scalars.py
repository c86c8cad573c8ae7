"""Element types (``ScalarType``): one declaration per type, the table every lookup derives from.

Every element type is a closed :class:`ScalarType` singleton (``numba_qk.f32``,
``numba_qk.bf16``, ``numba_qk.e4m3`` ...) declared here once, ml_dtypes-style: one
:class:`ElementSpec` row holds everything numba_qk knows about it -- bits and bias, inf/NaN
behaviour and the codes they encode to, storage and pack factor, names and aliases, the
ml_dtypes and DLPack spellings, the kernels' kind codes.  The numeric facts
(``t.bits``, ``t.max``, ``t.has_inf`` ...) are computed from the row when the singleton is
made, and nothing changes a singleton afterwards.  Every other table (names, ml_dtypes, DLPack,
storage dtypes, the casts' kind codes) is derived from the rows where it is used.

=========  =====  ==========  =====  ======================  ====  ====  ========
type       bits   S+E+M       bias   range                   inf   NaN   per byte
=========  =====  ==========  =====  ======================  ====  ====  ========
f32        32     1+8+23      127    +-3.4e38                yes   yes   --
f16        16     1+5+10      15     +-65504                 yes   yes   --
bf16       16     1+8+7       127    +-3.39e38               yes   yes   --
e4m3       8      1+4+3       7      +-448 (OCP E4M3 "fn")   no    yes   --
e5m2       8      1+5+2       15     +-57344                 yes   yes   --
e2m3       6      1+2+3       1      +-7.5  (1 per byte)     no    no    --
e3m2       6      1+3+2       3      +-28   (1 per byte)     no    no    --
e2m1       4      1+2+1       1      +-6                     no    no    2
e8m0       8      0+8+0       127    2^-127 .. 2^127         no    yes   --
i8/u8/i32  8/8/32 integers                                   --    --    --
i4 / u4    4      -8..7 / 0..15                              --    --    2
u1         1      0..1 (a number)                            --    --    8
=========  =====  ==========  =====  ======================  ====  ====  ========

Packed types put element 0 in the high nibble (i4, u4, e2m1) or the most significant bit (u1,
the ``numpy.packbits`` order).  fp6 codes sit in the low 6 bits of a byte (ml_dtypes' layout).

No numba and no numpy here (``numpy_dtype`` imports numpy when asked).  What an element type
does beyond its declaration -- numpy's view of its values, ``qk.bf16(1.5)`` -- comes from
:mod:`numba_qk.dtypes` through :data:`BEHAVIOUR`.
"""

from __future__ import annotations

import math
from fractions import Fraction
from types import MappingProxyType
from typing import NamedTuple, Optional

from ._schema import TOKEN, Singleton, check_count, no_subclass
from .ggml_types import GGMLType

__all__ = ["ScalarType", "ElementSpec", "f32", "f16", "bf16", "e4m3", "e5m2", "e2m3", "e3m2",
           "e2m1", "e8m0", "i8", "u8", "i32", "i4", "u4", "u1", "ELEMENT_TYPES", "SCALARS",
           "FACTS", "BEHAVIOUR"]

#: What an element type does beyond its declaration -- ``value_dtype(t)`` (numpy's view of its
#: values) and ``scalar(t, value)`` (``t(value)``) -- supplied by :mod:`numba_qk.dtypes`, the
#: layer above, when it is imported (``numba_qk`` always imports it).  A table filled from
#: above instead of an import from here keeps the declarations free of upward imports.
BEHAVIOUR: dict = {}

# DLPack's DLDataTypeCode values (DLPack 1.x), the first half of the rows' ``dlpack`` column
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool = 0, 1, 2, 4, 6
kDLFloat8_e4m3fn, kDLFloat8_e5m2, kDLFloat8_e8m0fnu = 10, 12, 14
kDLFloat6_e2m3fn, kDLFloat6_e3m2fn, kDLFloat4_e2m1fn = 15, 16, 17


class ElementSpec(NamedTuple):
    """One element type's declaration (``t.spec``): every fact numba_qk derives its lookups from."""

    attr: str                     # numba_qk.<attr>
    name: str                     # the GGML-style name ("BF16")
    aliases: tuple                # more names from_name accepts (NumKong, ml_dtypes, ...)
    kind: str                     # "float", "e8m0" (exponent only), "int", "uint"
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    bits: int                     # bits of one code's value (fp6: 6, in a byte)
    bias: int
    has_inf: bool
    has_nan: bool
    max_code: int                 # floats: the largest finite magnitude; integers: all ones
    overflow_code: int            # what +inf and positive overflow encode to (inf or saturation)
    nan_code: int                 # what NaN encodes to (the canonical quiet NaN; 0 without NaN)
    nan_signed: bool              # whether a negative NaN encodes to nan_code | sign bit
    payload_bytes: int            # bytes of one storage unit
    per_byte: int                 # elements per storage unit (2 or 8 for packed sub-byte types)
    numpy: Optional[str]          # numpy's own dtype of these values (f32, f16, i8, u8, i32)
    ggml_type: Optional[int]      # GGML type id
    ml_dtypes: Optional[str]      # ml_dtypes' dtype of the identical encoding
    dlpack: tuple                 # DLPack (type code, bits) of one element
    kernel_kind: int              # numba_qk.kernels.lowp.codecs.K_<NAME> (the casts' kind code)
    mx_kernel_kind: Optional[int]  # numba_qk.kernels.mx.codecs' code of an MX element type

    @property
    def names(self) -> tuple:
        """Every name of the type: its attribute, the aliases, the GGML-style name."""
        return (self.attr, *self.aliases, self.name)

    @property
    def storage(self) -> str:
        """numpy dtype of one storage unit: the values' own where numpy has it, else unsigned
        codes (uint16 for bf16, uint8 bytes for fp8/fp6/e8m0 and the packed types)."""
        return self.numpy if self.numpy is not None else f"<u{self.payload_bytes}"


def _facts(s: ElementSpec) -> dict:
    """The numeric facts (``t.max``, ``t.tiny`` ...) of a row."""
    if s.kind in ("int", "uint"):
        lo, hi = (-(1 << (s.bits - 1)), (1 << (s.bits - 1)) - 1) if s.kind == "int" else \
            (0, (1 << s.bits) - 1)
        facts = dict(max=hi, min=lo, tiny=None, smallest_subnormal=None, eps=None)
    else:
        e, m = s.max_code >> s.mantissa_bits, s.max_code & ((1 << s.mantissa_bits) - 1)
        fmax = float(Fraction(2) ** (e - s.bias) * (1 + Fraction(m, 1 << s.mantissa_bits)))
        facts = dict(max=fmax, min=-fmax,
                     tiny=math.ldexp(1.0, 1 - s.bias),                       # smallest normal
                     smallest_subnormal=math.ldexp(1.0, 1 - s.bias - s.mantissa_bits),
                     eps=math.ldexp(1.0, -s.mantissa_bits))
        if s.kind == "e8m0":          # powers of two only: 2^-127 .. 2^127, no zero
            facts.update(min=2.0 ** -127, tiny=2.0 ** -127, smallest_subnormal=2.0 ** -127,
                         eps=1.0, max=2.0 ** 127)
    facts.update(kind=s.kind, bits=s.bits, sign_bits=s.sign_bits, exponent_bits=s.exponent_bits,
                 mantissa_bits=s.mantissa_bits, bias=s.bias, has_inf=s.has_inf,
                 has_nan=s.has_nan, per_byte=s.per_byte, max_code=s.max_code,
                 payload_bytes=s.payload_bytes, is_packed=s.per_byte > 1,
                 code_bits=8 * s.payload_bytes // s.per_byte)      # storage bits of one code
    return facts


_SCALARS_BY_ATTR: dict = {}   # every ScalarType, by attribute name, in declaration order


def _lookup_scalar(attr):
    """The ScalarType named ``attr`` (what a pickled ScalarType refers to)."""
    return _SCALARS_BY_ATTR[attr]


_lookup_scalar.__module__ = "numba_qk.formats"   # pickles name numba_qk.formats._lookup_scalar


@no_subclass
class ScalarType(Singleton):
    """A plain element type (closed singleton), made from its declaration (``spec``).

    Packed sub-byte types (``i4``, ``u4``, ``e2m1``: two per byte; ``u1``: eight) count
    ``block_size`` elements per ``block_bytes = 1`` byte.  The numeric facts (``bits``,
    ``exponent_bits``, ``max`` ...) are read as attributes; calling a type (``qk.bf16(1.5)``)
    makes a scalar.
    """

    __slots__ = ("name", "block_bytes", "ggml_type", "_attr", "_numpy", "_is_float", "_facts",
                 "spec")
    _path, _lookup = "numba_qk.", _lookup_scalar

    is_quantized = False

    def __init__(self, token, *spec):
        if token is not TOKEN:
            raise TypeError("ScalarType objects are created by numba_qk only; use numba_qk.f32")
        (spec,) = spec
        self._init(name=spec.name, _attr=spec.attr, block_bytes=spec.payload_bytes,
                   _numpy=spec.numpy, _is_float=spec.kind in ("float", "e8m0"),
                   ggml_type=spec.ggml_type, _facts=MappingProxyType(_facts(spec)), spec=spec)
        _SCALARS_BY_ATTR[spec.attr] = self

    @property
    def is_float(self) -> bool:
        return self._is_float

    @property
    def block_size(self) -> int:
        """Elements per ``block_bytes``: 1, or 2 / 8 for packed sub-byte types."""
        return self._facts["per_byte"]

    @property
    def bits_per_element(self) -> float:
        return self.block_bytes * 8.0 / self.block_size

    @property
    def numpy_dtype(self):
        """The numpy dtype with the same storage (little-endian), or None (bf16: numpy has none)."""
        import numpy as np

        return None if self._numpy is None else np.dtype(self._numpy)

    def storage_bytes(self, n: int) -> Optional[int]:
        n = check_count(n)
        return None if n % self.block_size else n // self.block_size * self.block_bytes

    def __getattr__(self, key):  # the numeric facts (bits, max, has_inf, ...)
        if key == "dtype":  # lets numpy read ``np.array(x, dtype=qk.bf16)``
            return BEHAVIOUR["value_dtype"](self)
        facts = object.__getattribute__(self, "_facts")
        if key in facts:
            return facts[key]
        raise AttributeError(f"{type(self).__name__} {self.name} has no attribute {key!r}")

    def __call__(self, value):
        """A scalar of this type: ``numba_qk.bf16(1.5)`` (one rounding, the astype policy)."""
        return BEHAVIOUR["scalar"](self, value)



ScalarType.__module__ = "numba_qk.formats"


def _float(attr, sem, bias, inf, nan, codes, storage, dlpack, ml, kernel, *aliases, ggml=None,
           kind="float"):
    """A float type: sem = (sign, exponent, mantissa bits); codes = (largest finite magnitude,
    +inf/overflow, NaN, whether NaN keeps its sign); storage = (bytes, per byte, numpy dtype);
    kernel = (lowp kind, MX kind)."""
    (s, e, m), (max_code, ovf, nan_code, nan_signed) = sem, codes
    return ScalarType(TOKEN, ElementSpec(
        attr, attr.upper(), aliases, kind, s, e, m, s + e + m, bias, inf, nan, max_code, ovf,
        nan_code, nan_signed, *storage, ggml, ml, dlpack, *kernel))


def _int(attr, bits, signed, storage, dlpack, ml, kernel, *aliases, ggml=None):
    """An integer type (two's complement when signed): saturating, NaN encodes to 0."""
    top = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    return ScalarType(TOKEN, ElementSpec(
        attr, attr.upper(), aliases, "int" if signed else "uint", int(signed), 0, 0, bits, 0,
        False, False, (1 << bits) - 1, top, 0, False, *storage, ggml, ml, dlpack, *kernel))


# ---- the declarations, one per element type, in numba_qk's listing order ---------------------
#   attr     S  E  M    bias inf    NaN    max, +inf/overflow and NaN codes (NaN signed)
#            storage (bytes, per byte, numpy)  DLPack (code, bits)   ml_dtypes    kernel kinds
#            (lowp, MX)  aliases
f32 = _float("f32", (1, 8, 23), 127, True, True, (0x7F7FFFFF, 0x7F800000, 0x7FC00000, True),
             (4, 1, "<f4"), (kDLFloat, 32), None, (0, None), "float32", ggml=GGMLType.F32)
f16 = _float("f16", (1, 5, 10), 15, True, True, (0x7BFF, 0x7C00, 0x7E00, True),
             (2, 1, "<f2"), (kDLFloat, 16), None, (1, None), "float16", "half", ggml=GGMLType.F16)
bf16 = _float("bf16", (1, 8, 7), 127, True, True, (0x7F7F, 0x7F80, 0x7FC0, True),
              (2, 1, None), (kDLBfloat, 16), "bfloat16", (2, None), "bfloat16", ggml=GGMLType.BF16)
e4m3 = _float("e4m3", (1, 4, 3), 7, False, True, (0x7E, 0x7E, 0x7F, True),   # S.1111.111: NaN
              (1, 1, None), (kDLFloat8_e4m3fn, 8), "float8_e4m3fn", (3, 3),
              "float8_e4m3", "float8_e4m3fn", "fp8_e4m3")
e5m2 = _float("e5m2", (1, 5, 2), 15, True, True, (0x7B, 0x7C, 0x7E, True),
              (1, 1, None), (kDLFloat8_e5m2, 8), "float8_e5m2", (4, 4), "float8_e5m2", "fp8_e5m2")
e2m3 = _float("e2m3", (1, 2, 3), 1, False, False, (0x1F, 0x1F, 0, False),
              (1, 1, None), (kDLFloat6_e2m3fn, 6), "float6_e2m3fn", (5, 1),
              "float6_e2m3", "float6_e2m3fn", "fp6_e2m3")
e3m2 = _float("e3m2", (1, 3, 2), 3, False, False, (0x1F, 0x1F, 0, False),
              (1, 1, None), (kDLFloat6_e3m2fn, 6), "float6_e3m2fn", (6, 2),
              "float6_e3m2", "float6_e3m2fn", "fp6_e3m2")
e2m1 = _float("e2m1", (1, 2, 1), 1, False, False, (0x7, 0x7, 0, False),
              (1, 2, None), (kDLFloat4_e2m1fn, 4), "float4_e2m1fn", (7, 0),
              "float4_e2m1", "float4_e2m1fn", "fp4_e2m1")
e8m0 = _float("e8m0", (0, 8, 0), 127, False, True, (0xFE, 0xFE, 0xFF, False),
              (1, 1, None), (kDLFloat8_e8m0fnu, 8), "float8_e8m0fnu", (8, None),
              "float8_e8m0", "float8_e8m0fnu", "ue8m0", kind="e8m0")
i8 = _int("i8", 8, True, (1, 1, "i1"), (kDLInt, 8), None, (9, 5), "int8", ggml=GGMLType.I8)
u8 = _int("u8", 8, False, (1, 1, "u1"), (kDLUInt, 8), None, (10, None), "uint8")
i32 = _int("i32", 32, True, (4, 1, "<i4"), (kDLInt, 32), None, (11, None), "int32",
           ggml=GGMLType.I32)
i4 = _int("i4", 4, True, (1, 2, None), (kDLInt, 4), "int4", (12, None), "int4")
u4 = _int("u4", 4, False, (1, 2, None), (kDLUInt, 4), "uint4", (13, None), "uint4")
u1 = _int("u1", 1, False, (1, 8, None), (kDLUInt, 1), None, (14, None), "uint1")

#: Every element type, in declaration (= numba_qk's listing) order.
ELEMENT_TYPES = tuple(_SCALARS_BY_ATTR.values())
#: The element types GGML has (f32, f16, bf16, i8, i32).
SCALARS = tuple(t for t in ELEMENT_TYPES if t.ggml_type is not None)
#: Every element type's numeric facts (read-only mappings; ``t.max`` is ``FACTS[t]["max"]``).
FACTS = {t: t._facts for t in ELEMENT_TYPES}
