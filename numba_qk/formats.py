"""Closed, typed schemas for the tensor formats numba_qk understands.

A *format* says what the bytes of a tensor mean.  Two kinds exist:

* :class:`Format` -- a block-quantized record format (``Q4_K``, ``Q8_K``): a fixed number of
  logical elements (``block_size``) packed into a fixed number of bytes (``block_bytes``), laid
  out as an ordered tuple of :class:`Field` s.
* :class:`ScalarType` -- a plain element type (``f32``): one element per "block".

Both answer the same questions (spec 001): ``block_size``, ``block_bytes``, ``is_quantized``,
``is_float`` and ``storage_bytes(n)`` (``None`` when ``n`` is not a whole number of blocks).

The set of formats is *closed*: instances are created only in this module, cannot be modified,
cannot be subclassed, and there is no public way to register new ones.  Formats are compared by
identity; strings and numpy dtypes are never accepted in their place.

The field tables below are the single source of truth for record layout.  At import time every
format checks that its fields tile ``[0, block_bytes)`` exactly: each byte span is either owned by
one field or shared by fields whose bit widths fill it completely (Q4_K's packed 6-bit ``sc``/``m``).
"""

from __future__ import annotations

from typing import Iterator, Optional

__all__ = ["Field", "Format", "ScalarType", "QuantNamespace", "quant", "f32", "f16", "bf16", "i8",
           "i32", "from_ggml_type", "activation_format"]

_TOKEN = object()  # only this module can construct schema objects


class _Frozen:
    """Base for immutable, unsubclassable schema objects."""

    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} objects are immutable")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} objects are immutable")

    def _init(self, **attrs):
        for key, value in attrs.items():
            object.__setattr__(self, key, value)


def _no_subclass(cls):
    def __init_subclass__(sub, **kwargs):
        raise TypeError(f"{cls.__name__} is closed: it cannot be subclassed")

    cls.__init_subclass__ = classmethod(__init_subclass__)
    return cls


@_no_subclass
class Field(_Frozen):
    """One field of a record: a name, a byte span and how its elements are stored.

    Attributes
    ----------
    name : str        -- spec name (``d``, ``dmin``, ``sc``, ``m``, ``q``, ``ds``, ``bsum``)
    start, stop : int -- byte span ``[start, stop)`` relative to the record
    element : str     -- element type: ``'f16'``, ``'f32'``, ``'u6'``, ``'u4'``, ``'i8'``, ``'i16'``
    count : int       -- number of elements
    bits : int        -- bit width of one element
    signed : bool     -- two's complement (integers) or IEEE (floats; always signed)
    """

    __slots__ = ("name", "start", "stop", "element", "count", "bits", "signed")

    def __init__(self, token, name, start, stop, element, count, bits, signed):
        if token is not _TOKEN:
            raise TypeError("Field objects are created by numba_qk only")
        self._init(name=name, start=start, stop=stop, element=element, count=count,
                   bits=bits, signed=signed)

    @property
    def span(self) -> tuple[int, int]:
        return (self.start, self.stop)

    @property
    def nbytes(self) -> int:
        return self.stop - self.start

    def __repr__(self):
        return (f"Field({self.name!r}, bytes [{self.start}, {self.stop}), {self.element} x "
                f"{self.count}, {self.bits}-bit, {'signed' if self.signed else 'unsigned'})")

    def __reduce__(self):
        raise TypeError("Field objects are not picklable on their own; pickle the Format")


@_no_subclass
class Format(_Frozen):
    """A block-quantized record format (closed singleton, compare with ``is``)."""

    __slots__ = ("name", "block_size", "block_bytes", "fields", "ggml_type", "_attr", "_doc")

    is_quantized = True
    is_float = False

    def __init__(self, token, name, attr, block_size, block_bytes, fields, doc, ggml_type):
        if token is not _TOKEN:
            raise TypeError("Format objects are created by numba_qk only; use numba_qk.quant.*")
        self._init(name=name, _attr=attr, block_size=block_size, block_bytes=block_bytes,
                   fields=tuple(fields), _doc=doc, ggml_type=ggml_type)
        _check_tiling(self)

    # Aliases in record vocabulary.
    @property
    def elements_per_record(self) -> int:
        return self.block_size

    @property
    def record_bytes(self) -> int:
        return self.block_bytes

    @property
    def bits_per_element(self) -> float:
        return self.block_bytes * 8 / self.block_size

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.name} has no field {name!r}; fields: "
                       f"{', '.join(f.name for f in self.fields)}")

    def storage_bytes(self, n: int) -> Optional[int]:
        """Bytes needed for ``n`` logical elements, or ``None`` if ``n`` is not whole records."""
        n = _check_count(n)
        if n % self.block_size:
            return None
        return n // self.block_size * self.block_bytes

    def __repr__(self):
        return f"numba_qk.quant.{self._attr}"

    def __str__(self):
        return self.name

    def __reduce__(self):  # pickles as a reference to the singleton
        return (_lookup_format, (self._attr,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


@_no_subclass
class ScalarType(_Frozen):
    """A plain element type (closed singleton).

    Packed sub-byte types (``i4``, ``u4``, ``e2m1``: two per byte; ``u1``: eight) count
    ``block_size`` elements per ``block_bytes = 1`` byte.  The numeric facts (``bits``,
    ``exponent_bits``, ``max`` ...) come from the table in :mod:`numba_qk.dtypes`, which also
    declares the low-precision singletons; calling a type (``qk.bf16(1.5)``) makes a scalar.
    """

    __slots__ = ("name", "block_bytes", "ggml_type", "_attr", "_numpy", "_is_float", "_facts")

    is_quantized = False

    def __init__(self, token, name, attr, nbytes, numpy_name, is_float, ggml_type):
        if token is not _TOKEN:
            raise TypeError("ScalarType objects are created by numba_qk only; use numba_qk.f32")
        self._init(name=name, _attr=attr, block_bytes=nbytes, _numpy=numpy_name,
                   _is_float=is_float, ggml_type=ggml_type, _facts=None)

    @property
    def is_float(self) -> bool:
        return self._is_float

    @property
    def block_size(self) -> int:
        """Elements per ``block_bytes``: 1, or 2 / 8 for packed sub-byte types."""
        return self._facts["per_byte"] if self._facts else 1

    @property
    def bits_per_element(self) -> float:
        return self.block_bytes * 8.0 / self.block_size

    @property
    def numpy_dtype(self):
        """The numpy dtype with the same storage (little-endian), or None (bf16: numpy has none)."""
        import numpy as np

        return None if self._numpy is None else np.dtype(self._numpy)

    def storage_bytes(self, n: int) -> Optional[int]:
        n = _check_count(n)
        return None if n % self.block_size else n // self.block_size * self.block_bytes

    def __getattr__(self, key):  # the numeric facts (bits, max, has_inf, ...): numba_qk.dtypes
        if key == "dtype":  # lets numpy read ``np.array(x, dtype=qk.bf16)``
            from .dtypes import value_dtype

            return value_dtype(self)
        facts = object.__getattribute__(self, "_facts")
        if facts is not None and key in facts:
            return facts[key]
        raise AttributeError(f"{type(self).__name__} {self.name} has no attribute {key!r}")

    def __call__(self, value):
        """A scalar of this type: ``numba_qk.bf16(1.5)`` (one rounding, the astype policy)."""
        from .dtypes import scalar

        return scalar(self, value)

    def __repr__(self):
        return f"numba_qk.{self._attr}"

    def __str__(self):
        return self.name

    def __reduce__(self):
        return (_lookup_scalar, (self._attr,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def _check_count(n) -> int:
    import operator

    if isinstance(n, bool):
        raise TypeError("storage_bytes(n): n must be an integer element count, got bool")
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"storage_bytes(n): n must be an integer element count, "
                        f"got {type(n).__name__}") from None
    if n < 0:
        raise ValueError(f"storage_bytes(n): n must be >= 0, got {n}")
    return n


def _check_tiling(fmt: Format) -> None:
    """Fields must tile [0, block_bytes) exactly; shared spans must be filled bit for bit."""
    spans: dict[tuple[int, int], int] = {}
    for f in fmt.fields:
        if not (0 <= f.start < f.stop <= fmt.block_bytes):
            raise AssertionError(f"{fmt.name}.{f.name}: span {f.span} outside the record")
        spans[f.span] = spans.get(f.span, 0) + f.count * f.bits
    pos = 0
    for (start, stop), bits in sorted(spans.items()):
        if start != pos:
            raise AssertionError(f"{fmt.name}: bytes [{pos}, {start}) are not covered, or spans overlap")
        if bits != (stop - start) * 8:
            raise AssertionError(f"{fmt.name}: span [{start}, {stop}) holds {bits} bits of fields, "
                                 f"expected {(stop - start) * 8}")
        pos = stop
    if pos != fmt.block_bytes:
        raise AssertionError(f"{fmt.name}: fields end at byte {pos}, record is {fmt.block_bytes} bytes")


def _F(*args):
    return Field(_TOKEN, *args)


q4_k = Format(
    _TOKEN, "Q4_K", "q4_k", 256, 144,
    [
        _F("d", 0, 2, "f16", 1, 16, True),        # super-block scale for the sub-block scales
        _F("dmin", 2, 4, "f16", 1, 16, True),     # super-block scale for the sub-block mins
        _F("sc", 4, 16, "u6", 8, 6, False),       # packed with m: 8 x 6-bit scales
        _F("m", 4, 16, "u6", 8, 6, False),        # packed with sc: 8 x 6-bit mins
        _F("q", 16, 144, "u4", 256, 4, False),    # 256 x 4-bit quants
    ],
    "Q4_K weights: 256 elements in 8 sub-blocks of 32, 4-bit quants, 6-bit scales and mins",
    12,
)

q8_k = Format(
    _TOKEN, "Q8_K", "q8_k", 256, 292,
    [
        _F("ds", 0, 4, "f32", 1, 32, True),       # block scale
        _F("q", 4, 260, "i8", 256, 8, True),      # 256 x 8-bit quants
        _F("bsum", 260, 292, "i16", 16, 16, True),  # sums of q over groups of 16
    ],
    "Q8_K activations: 256 elements, 8-bit quants, f32 scale, 16 group sums",
    15,
)

# ggml's legacy 32-element formats (ggml-common.h block_q4_0 ... block_q8_1).  In the 4- and
# 5-bit formats element j (0 <= j < 16) is the low nibble of qs[j] and element j + 16 the high
# nibble; Q5's fifth bit of element j is bit j of the little-endian 32-bit qh.
q4_0 = Format(
    _TOKEN, "Q4_0", "q4_0", 32, 18,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("qs", 2, 18, "u4", 32, 4, False)],
    "Q4_0: 32 elements, value = (q - 8) * d", 2,
)
q4_1 = Format(
    _TOKEN, "Q4_1", "q4_1", 32, 20,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("m", 2, 4, "f16", 1, 16, True),
     _F("qs", 4, 20, "u4", 32, 4, False)],
    "Q4_1: 32 elements, value = q * d + m", 3,
)
q5_0 = Format(
    _TOKEN, "Q5_0", "q5_0", 32, 22,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("qh", 2, 6, "u1", 32, 1, False),
     _F("qs", 6, 22, "u4", 32, 4, False)],
    "Q5_0: 32 elements, value = (q - 16) * d, q = low nibble | fifth bit << 4", 6,
)
q5_1 = Format(
    _TOKEN, "Q5_1", "q5_1", 32, 24,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("m", 2, 4, "f16", 1, 16, True),
     _F("qh", 4, 8, "u1", 32, 1, False), _F("qs", 8, 24, "u4", 32, 4, False)],
    "Q5_1: 32 elements, value = q * d + m, q = low nibble | fifth bit << 4", 7,
)
q8_0 = Format(
    _TOKEN, "Q8_0", "q8_0", 32, 34,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("qs", 2, 34, "i8", 32, 8, True)],
    "Q8_0: 32 elements, value = q * d", 8,
)
q8_1 = Format(
    _TOKEN, "Q8_1", "q8_1", 32, 36,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("s", 2, 4, "f16", 1, 16, True),
     _F("qs", 4, 36, "i8", 32, 8, True)],
    "Q8_1: 32 elements, value = q * d; s = d * sum(q) (activations paired with Q4_1/Q5_1)", 9,
)

f32 = ScalarType(_TOKEN, "F32", "f32", 4, "<f4", True, 0)
f16 = ScalarType(_TOKEN, "F16", "f16", 2, "<f2", True, 1)
bf16 = ScalarType(_TOKEN, "BF16", "bf16", 2, None, True, 30)
i8 = ScalarType(_TOKEN, "I8", "i8", 1, "i1", False, 24)
i32 = ScalarType(_TOKEN, "I32", "i32", 4, "<i4", False, 26)

_FORMATS = {"q4_k": q4_k, "q8_k": q8_k, "q4_0": q4_0, "q4_1": q4_1, "q5_0": q5_0,
            "q5_1": q5_1, "q8_0": q8_0, "q8_1": q8_1}
_SCALARS = {"f32": f32, "f16": f16, "bf16": bf16, "i8": i8, "i32": i32}
_BY_GGML_TYPE = {t.ggml_type: t for t in (*_FORMATS.values(), *_SCALARS.values())}

# Which activation format each weight format's dot pairs with (ggml's vec_dot_type).
_ACTIVATION_FORMAT = {q4_k: q8_k, q4_0: q8_0, q5_0: q8_0, q8_0: q8_0, q4_1: q8_1, q5_1: q8_1}


def from_ggml_type(type_id: int):
    """The numba_qk format or scalar type for a GGML type id (``enum ggml_type``).

    Raises ``KeyError`` naming the id for GGML types numba_qk does not model.
    """
    import operator

    tid = operator.index(type_id)
    try:
        return _BY_GGML_TYPE[tid]
    except KeyError:
        known = ", ".join(f"{k}={v.name}" for k, v in sorted(_BY_GGML_TYPE.items()))
        raise KeyError(f"GGML type id {tid} is not modelled by numba_qk (known: {known})") from None


def activation_format(weight_format: Format) -> Format:
    """The activation format a weight format's quantized dot pairs with (Q4_K -> Q8_K, ...)."""
    try:
        return _ACTIVATION_FORMAT[weight_format]
    except (KeyError, TypeError):
        raise TypeError(f"{weight_format!r} has no quantized dot; weight formats: "
                        f"{', '.join(repr(f) for f in _ACTIVATION_FORMAT)}") from None


def _lookup_format(attr):
    return _FORMATS[attr]


def _lookup_scalar(attr):
    return _SCALARS[attr]


def _register_scalar(t: ScalarType, facts: dict) -> None:
    """Hook for numba_qk.dtypes: attach the numeric facts and make ``t`` picklable/findable."""
    object.__setattr__(t, "_facts", dict(facts))
    _SCALARS[t._attr] = t
    if t.ggml_type is not None:
        _BY_GGML_TYPE[t.ggml_type] = t


@_no_subclass
class QuantNamespace(_Frozen):
    """``numba_qk.quant``: the closed set of block-quantized formats."""

    __slots__ = ()

    q4_k = q4_k
    q8_k = q8_k
    q4_0 = q4_0
    q4_1 = q4_1
    q5_0 = q5_0
    q5_1 = q5_1
    q8_0 = q8_0
    q8_1 = q8_1

    def __iter__(self) -> Iterator[Format]:
        return iter(_FORMATS.values())

    def __contains__(self, item) -> bool:
        return any(item is f for f in _FORMATS.values())

    def __repr__(self):
        return f"numba_qk.quant({', '.join(f.name for f in self)})"


quant = QuantNamespace()
