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

__all__ = ["Field", "Format", "ScalarType", "QuantNamespace", "quant", "f32"]

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

    __slots__ = ("name", "block_size", "block_bytes", "fields", "_attr", "_doc")

    is_quantized = True
    is_float = False

    def __init__(self, token, name, attr, block_size, block_bytes, fields, doc):
        if token is not _TOKEN:
            raise TypeError("Format objects are created by numba_qk only; use numba_qk.quant.*")
        self._init(name=name, _attr=attr, block_size=block_size, block_bytes=block_bytes,
                   fields=tuple(fields), _doc=doc)
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
    """A plain element type (closed singleton): one element per block."""

    __slots__ = ("name", "block_bytes", "_attr", "_numpy", "_is_float")

    block_size = 1
    is_quantized = False

    def __init__(self, token, name, attr, nbytes, numpy_name, is_float):
        if token is not _TOKEN:
            raise TypeError("ScalarType objects are created by numba_qk only; use numba_qk.f32")
        self._init(name=name, _attr=attr, block_bytes=nbytes, _numpy=numpy_name,
                   _is_float=is_float)

    @property
    def is_float(self) -> bool:
        return self._is_float

    @property
    def bits_per_element(self) -> float:
        return self.block_bytes * 8.0

    @property
    def numpy_dtype(self):
        """The numpy dtype with the same storage (little-endian)."""
        import numpy as np

        return np.dtype(self._numpy)

    def storage_bytes(self, n: int) -> Optional[int]:
        return _check_count(n) * self.block_bytes

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
)

q8_k = Format(
    _TOKEN, "Q8_K", "q8_k", 256, 292,
    [
        _F("ds", 0, 4, "f32", 1, 32, True),       # block scale
        _F("q", 4, 260, "i8", 256, 8, True),      # 256 x 8-bit quants
        _F("bsum", 260, 292, "i16", 16, 16, True),  # sums of q over groups of 16
    ],
    "Q8_K activations: 256 elements, 8-bit quants, f32 scale, 16 group sums",
)

f32 = ScalarType(_TOKEN, "F32", "f32", 4, "<f4", True)

_FORMATS = {"q4_k": q4_k, "q8_k": q8_k}
_SCALARS = {"f32": f32}


def _lookup_format(attr):
    return _FORMATS[attr]


def _lookup_scalar(attr):
    return _SCALARS[attr]


@_no_subclass
class QuantNamespace(_Frozen):
    """``numba_qk.quant``: the closed set of block-quantized formats."""

    __slots__ = ()

    q4_k = q4_k
    q8_k = q8_k

    def __iter__(self) -> Iterator[Format]:
        return iter(_FORMATS.values())

    def __contains__(self, item) -> bool:
        return any(item is f for f in _FORMATS.values())

    def __repr__(self):
        return f"numba_qk.quant({', '.join(f.name for f in self)})"


quant = QuantNamespace()
