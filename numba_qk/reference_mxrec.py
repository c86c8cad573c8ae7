"""Moved to ``numba_qk.testing.reference.mxrec``; this path stays so old imports keep working
(it is the same module object)."""

import sys

from numba_qk.testing.reference import mxrec as _moved

sys.modules[__name__] = _moved
