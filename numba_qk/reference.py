"""Moved to ``numba_qk.testing.reference.core``; this path stays so old imports keep working
(it is the same module object)."""

import sys

from numba_qk.testing.reference import core as _moved

sys.modules[__name__] = _moved
