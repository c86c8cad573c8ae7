"""Exception types raised by numba_qk's public API."""

__all__ = ["NumbaQKError", "QuantizationDomainError"]


class NumbaQKError(Exception):
    """Base class of numba_qk's own errors."""


class QuantizationDomainError(NumbaQKError, ValueError):
    """A block cannot be quantized: a non-finite value, or an extreme too small to invert.

    Attributes: ``block`` (index of the first bad block), ``reason`` (text).
    """

    def __init__(self, block: int, reason: str):
        self.block = block
        self.reason = reason
        super().__init__(f"block {block}: {reason}")
