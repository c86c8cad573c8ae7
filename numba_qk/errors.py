"""Exception types raised by numba_qk's public API."""

__all__ = ["NumbaQKError", "QuantizationDomainError"]


class NumbaQKError(Exception):
    """Base class of numba_qk's own errors."""


class QuantizationDomainError(NumbaQKError, ValueError):
    """A block cannot be quantized: a non-finite value, an extreme too small to invert, or
    (IQ3_XXS, IQ3_S) values so large that ggml's grid search aborts on them.

    Attributes: ``block`` (index of the first bad block), ``reason`` (text) and, for
    ``matmul``'s activations, ``row`` (the activation row; ``block`` counts within it).
    """

    def __init__(self, block: int, reason: str, row=None):
        self.block = block
        self.reason = reason
        self.row = row
        where = f"block {block}" if row is None else f"activation row {row}, block {block}"
        super().__init__(f"{where}: {reason}")
