"""The schema machinery: ``Field``, ``Format`` and the import-time layout checks (no numba).

Instances are created only inside ``numba_qk.formats`` (they need ``TOKEN``); the declarations
live in one module per family (``kquants``, ``legacy``, ``scalars``) and are collected, named and
looked up in ``numba_qk.formats`` (``__init__``).  See that module's docstring.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["Field", "Format"]

TOKEN = object()  # only this module can construct schema objects


class Frozen:
    """Base for immutable, unsubclassable schema objects."""

    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} objects are immutable")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} objects are immutable")

    def _init(self, **attrs):
        for key, value in attrs.items():
            object.__setattr__(self, key, value)


class Singleton(Frozen):
    """Base of the declared singletons (Format, ScalarType, ScaledFormat): ``repr`` is the
    public path (``_path`` + attribute name), ``str`` the name, a copy the object itself, a pickle
    a reference by attribute name (``_lookup(_attr)``, a module-level function)."""

    __slots__ = ()
    _path = ""
    _lookup = None

    def __repr__(self):
        return f"{self._path}{self._attr}"

    def __str__(self):
        return self.name

    def __reduce__(self):  # pickles as a reference to the singleton
        return (type(self)._lookup, (self._attr,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def no_subclass(cls):
    def __init_subclass__(sub, **kwargs):
        raise TypeError(f"{cls.__name__} is closed: it cannot be subclassed")

    cls.__init_subclass__ = classmethod(__init_subclass__)
    return cls


@no_subclass
class Field(Frozen):
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
        if token is not TOKEN:
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


@no_subclass
class Format(Singleton):
    """A block-quantized record format (closed singleton, compare with ``is``)."""

    __slots__ = ("name", "block_size", "block_bytes", "fields", "ggml_type", "_attr", "_doc")

    is_quantized = True
    is_float = False

    def __init__(self, token, name, attr, block_size, block_bytes, fields, doc, ggml_type):
        if token is not TOKEN:
            raise TypeError("Format objects are created by numba_qk only; use numba_qk.quant.*")
        self._init(name=name, _attr=attr, block_size=block_size, block_bytes=block_bytes,
                   fields=tuple(fields), _doc=doc, ggml_type=ggml_type)
        check_tiling(self)
        _check_ggml_type(self)
        _FORMATS_BY_ATTR[attr] = self

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
        n = check_count(n)
        if n % self.block_size:
            return None
        return n // self.block_size * self.block_bytes



_FORMATS_BY_ATTR: dict = {}   # every Format, by attribute name, as it is declared


def _lookup_format(attr):
    """The Format named ``attr`` (what a pickled Format refers to)."""
    return _FORMATS_BY_ATTR[attr]


_lookup_format.__module__ = "numba_qk.formats"   # pickles name numba_qk.formats._lookup_format
Format._path, Format._lookup = "numba_qk.quant.", _lookup_format


def check_count(n) -> int:
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


def check_tiling(fmt: Format) -> None:
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


def _check_ggml_type(fmt) -> None:
    """A format's GGML type id and block size agree with ggml's table (formats.ggml_types)."""
    from .ggml_types import BLOCK_SIZE, GGML_TYPES

    if GGML_TYPES.get(fmt.name) != fmt.ggml_type:
        raise AssertionError(f"{fmt.name}: ggml_type {fmt.ggml_type} is not ggml's id "
                             f"{GGML_TYPES.get(fmt.name)}")
    if BLOCK_SIZE[fmt.ggml_type] != fmt.block_size:
        raise AssertionError(f"{fmt.name}: block size {fmt.block_size} is not ggml's "
                             f"{BLOCK_SIZE[fmt.ggml_type]}")


def F(*args):
    return Field(TOKEN, *args)


def f16(name, at):
    """An IEEE f16 scalar field ``name`` at byte ``at``."""
    return F(name, at, at + 2, "f16", 1, 16, True)


def ggml_format(name, block_size, block_bytes, fields, doc):
    """ggml's record format ``name`` (``"Q1_0"``): attribute ``name.lower()``, GGML type
    ``GGMLType.<name>``."""
    from .ggml_types import GGMLType

    return Format(TOKEN, name, name.lower(), block_size, block_bytes, fields, doc,
                  getattr(GGMLType, name))




for _cls in (Field, Format):
    _cls.__module__ = "numba_qk.formats"
