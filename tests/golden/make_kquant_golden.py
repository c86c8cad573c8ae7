"""Generate tests/golden/kquant_inputs.npz and tests/golden/<t>_ggml.npz (t = q2_k, q3_k, q5_k,
q6_k): inputs, and ggml's own records and dequantized values for them.

    python tests/golden/make_kquant_golden.py [q6_k ...]   # needs libggml-python (x86-64 Linux)

Records come from ggml's ``quantize_row_<t>_ref`` and values from ``dequantize_row_<t>``
(through ``ggml_get_type_traits(type)->from_float_ref`` / ``to_float``), never from numba_qk;
the library version is stored in each file.  Inputs (float32, blocks of 256; fixed seeds),
shared by every format (kquant_inputs.npz):
  normal      40 blocks  standard normal                                     (seed 11)
  heavy       32 blocks  standard Cauchy                                     (seed 12)
  scaled      32 blocks  normal * 10**U(-35, 35) per block                   (seed 13)
  f16edge     32 blocks  normal * 10**U(-12, 12) per block: super-block scales
                         around f16's subnormal, underflow and overflow edges (seed 14)
  huge         6 blocks  normal * 1e30 (x*x overflows; f16 scales overflow)  (seed 15)
  tiny         6 blocks  normal * 1e-30 (f16 scales underflow to zero)       (seed 16)
  positive    16 blocks  |normal|                                            (seed 17)
  sparse       8 blocks  normal with ~90% exact zeros                        (seed 18)
  equal        6 blocks  every value 0.3, -2.0, 1e-3, 7.0, 1e-20, -6e4
  zero         2 blocks  +0.0, -0.0
  structured  20 blocks  (seed 19) single spikes (+-1, -1e-3, 1e20, 3e38), half the sub-blocks
                         zero, sub-blocks below GROUP_MAX_EPS (1e-16) beside normal ones,
                         half-integers (rounding ties), exact +-1 alternation, a ramp,
                         f32 subnormals, max-f32 values (x*x overflows), one nonzero per
                         sub-block, a constant block with one outlier
and per format 32 records of random bytes (seed 20 + type id) with ggml's dequantization
(``r_random``, ``y_random``).
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TYPES = {"q2_k": (10, 84), "q3_k": (11, 110), "q5_k": (13, 176), "q6_k": (14, 210)}


def structured(r) -> np.ndarray:
    rows = []
    for i, v in enumerate((1.0, -1.0, -1e-3, 1e20, 3e38)):
        x = np.zeros(256)
        x[(37 * i + 5) % 256] = v
        rows.append(x)
    for _ in range(2):
        x = r.standard_normal(256)
        x[np.repeat(r.random(16) < 0.5, 16)] = 0.0
        rows.append(x)
    for _ in range(2):
        x = r.standard_normal(256)
        x[np.repeat(r.random(16) < 0.5, 16)] *= 1e-16
        rows.append(x)
    for _ in range(3):
        rows.append(r.integers(-8, 8, 256) * 0.5)
    rows.append(np.where(np.arange(256) % 2, 1.0, -1.0))
    rows.append(np.linspace(-1.0, 1.0, 256))
    rows.append(r.standard_normal(256) * 1e-45)  # f32 subnormals (and zeros)
    rows.append(r.choice([-3.4e38, 3.4e38, 0.0, 1.0], 256))
    rows.append(r.standard_normal(256) * 3e38 / 5)
    x = np.zeros(256)
    x[np.arange(16) * 16 + r.integers(0, 16, 16)] = r.standard_normal(16)
    rows.append(x)
    x = np.full(256, 0.25)
    x[100] = -40.0
    rows.append(x)
    x = r.standard_normal(256)
    x[::16] = 1e-30
    rows.append(x)
    return np.array(rows)


def inputs() -> dict:
    rng = lambda s: np.random.default_rng(s)  # noqa: E731
    sparse = rng(18).standard_normal((8, 256))
    sparse[rng(18).random((8, 256)) < 0.9] = 0.0
    groups = {
        "normal": rng(11).standard_normal((40, 256)),
        "heavy": rng(12).standard_cauchy((32, 256)),
        "scaled": rng(13).standard_normal((32, 256)) * 10.0 ** rng(113).uniform(-35, 35, (32, 1)),
        "f16edge": rng(14).standard_normal((32, 256)) * 10.0 ** rng(114).uniform(-12, 12, (32, 1)),
        "huge": rng(15).standard_normal((6, 256)) * 1e30,
        "tiny": rng(16).standard_normal((6, 256)) * 1e-30,
        "positive": np.abs(rng(17).standard_normal((16, 256))),
        "sparse": sparse,
        "equal": np.repeat(np.array([[0.3], [-2.0], [1e-3], [7.0], [1e-20], [-6e4]]), 256, axis=1),
        "zero": np.stack([np.zeros(256), -np.zeros(256)]),
        "structured": structured(rng(19)),
    }
    return {k: np.asarray(v, np.float32) for k, v in groups.items()}


def main(argv) -> int:
    sys.path.insert(0, str(HERE.parent.parent))
    from numba_qk.testing import ggml as ggml_bridge

    ggml = ggml_bridge.load()
    if ggml is None:
        print("libggml-python is not installed", file=sys.stderr)
        return 1
    names = argv or list(TYPES)
    data = inputs()
    version = np.array(f"libggml-python {ggml.version}")
    np.savez_compressed(HERE / "kquant_inputs.npz", ggml_version=version,
                        **{f"x_{k}": v for k, v in data.items()})
    for name in names:
        type_id, nbytes = TYPES[name]
        out = {"ggml_version": version}
        for group, x in data.items():
            out[f"q_{group}"] = ggml.quantize_ref(type_id, x)
        r = np.random.default_rng(20 + type_id).integers(0, 256, (32, nbytes), dtype=np.uint8)
        out["r_random"] = r
        out["y_random"] = ggml.dequantize(type_id, r)
        np.savez_compressed(HERE / f"{name}_ggml.npz", **out)
        print(f"wrote {HERE / (name + '_ggml.npz')} "
              f"({sum(v.shape[0] for v in data.values())} blocks, libggml-python {ggml.version})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
