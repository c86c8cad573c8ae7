"""Generate tests/golden/q4_k_ggml.npz: inputs and ggml's own Q4_K records for them.

    python tests/golden/make_q4_k_golden.py      # needs libggml-python (x86-64 Linux wheel)

The records come from ggml's ``quantize_row_q4_K_ref`` (through ``ggml_get_type_traits
(GGML_TYPE_Q4_K)->from_float_ref``), never from numba_qk; the library version is stored in
the file.  Inputs (all float32, blocks of 256), fixed seeds:
  normal      64 blocks  standard normal                            (seed 1)
  heavy       64 blocks  standard Cauchy                            (seed 2)
  scaled      32 blocks  normal * 10**U(-20, 20) per block          (seed 3)
  tiny        16 blocks  normal * 1e-30                             (seed 4)
  huge        16 blocks  normal * 1e30                              (seed 5)
  positive    16 blocks  |normal| (no negative values: min clamps to 0) (seed 6)
  equal        4 blocks  every value 0.3, -2.0, 1e-3, 7.0
  zero         2 blocks  +0.0, -0.0
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def inputs() -> dict:
    rng = lambda s: np.random.default_rng(s)  # noqa: E731
    groups = {
        "normal": rng(1).standard_normal((64, 256)),
        "heavy": rng(2).standard_cauchy((64, 256)),
        "scaled": rng(3).standard_normal((32, 256)) * 10.0 ** rng(3).uniform(-20, 20, (32, 1)),
        "tiny": rng(4).standard_normal((16, 256)) * 1e-30,
        "huge": rng(5).standard_normal((16, 256)) * 1e30,
        "positive": np.abs(rng(6).standard_normal((16, 256))),
        "equal": np.repeat(np.array([[0.3], [-2.0], [1e-3], [7.0]]), 256, axis=1),
        "zero": np.stack([np.zeros(256), -np.zeros(256)]),
    }
    return {k: np.asarray(v, np.float32) for k, v in groups.items()}


def main() -> int:
    sys.path.insert(0, str(HERE.parent.parent))
    from numba_qk.testing import ggml as ggml_bridge

    ggml = ggml_bridge.load()
    if ggml is None:
        print("libggml-python is not installed", file=sys.stderr)
        return 1
    data = inputs()
    out = {}
    for name, x in data.items():
        out[f"x_{name}"] = x
        out[f"q_{name}"] = ggml.quantize_ref(ggml_bridge.GGML_TYPE_Q4_K, x)
    out["ggml_version"] = np.array(ggml.version)  # "libggml-python X.Y.Z"
    np.savez_compressed(HERE / "q4_k_ggml.npz", **out)
    print(f"wrote {HERE / 'q4_k_ggml.npz'} ({sum(v.shape[0] for v in data.values())} blocks, "
          f"{ggml.version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
