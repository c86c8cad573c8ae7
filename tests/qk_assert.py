"""Moved to ``numba_qk.testing.asserts``; kept so tests written against the old name still
import (new tests: ``from numba_qk.testing.asserts import ...``)."""
from numba_qk.testing.asserts import assert_same_f32, assert_same_records, bits_equal  # noqa: F401
