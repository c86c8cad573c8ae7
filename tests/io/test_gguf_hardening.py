"""GGUF layer hardening (issue 8): each defect's reproducer, plus a small deterministic fuzz corpus.

The files are built byte by byte (tests/gguf_build.py) so every count, length, type and offset
can be set to a hostile value; tests/gguf_fuzz.py makes the mutants (the same generator the
2,000-file before/after run in docs/decisions/010-gguf-hardening.md used).
"""

import os
import re
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

gguf_py = pytest.importorskip("gguf")

import numba_qk as qk  # noqa: E402
from numba_qk import gguf  # noqa: E402

import gguf_build as B  # noqa: E402
import gguf_fuzz  # noqa: E402
from numba_qk.testing.asserts import assert_same_f32, assert_same_records  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
F32, F16, Q4_0, Q8_0, Q8_1, Q4_K, BF16 = 0, 1, 2, 8, 9, 12, 30
Q4K = qk.quant.q4_k


def f32_bytes(a):
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def write(tmp_path, data, name="t.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def run_py(code, timeout=240, env=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))


def cli(capsys, *args):
    """The CLI in-process: (status, stdout, stderr)."""
    from numba_qk.__main__ import main

    code = main(list(map(str, args)))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(code, err, match):
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and match in lines[0], err


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A legal file: KVs of every kind, F32/F16 matrices, a Q4_K matrix, a 1-D norm."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((8, 256)) * 0.1).astype(np.float32)
    q = qk.quantize(rng.standard_normal((16, 256)).astype(np.float32), format=Q4K)
    kvs = [B.kv("general.architecture", B.STRING, "llama"),
           B.kv("a.u32", B.UINT32, 7), B.kv("a.bool", B.BOOL, True),
           B.kv("a.floats", B.ARRAY, (B.FLOAT32, [0.5, -1.0])),
           B.kv("a.words", B.ARRAY, (B.STRING, ["x", "", "yz"]))]
    tensors = [("a.weight", (256, 8), F32, f32_bytes(a)),
               ("h.weight", (256, 8), F16, a.astype("<f2").tobytes()),
               ("k.weight", (256, 16), Q4_K, q.tobytes()),
               ("norm.weight", (8,), F32, f32_bytes(np.ones(8)))]
    p = tmp_path_factory.mktemp("small") / "small.gguf"
    p.write_bytes(B.build(kvs, tensors))
    return p


# ---------------------------------------------------------------- 1. views outlive close()

def test_views_returned_from_a_with_block_stay_valid(tmp_path):
    """The README's pattern: records()/raw() returned out of a ``with`` block, then allocations,
    then matmul.  Run in a subprocess: a dangling pointer would segfault or give wrong values."""
    r = run_py(f"""
        import gc, numpy as np, numba_qk as qk
        from numba_qk import gguf
        p = gguf.write_demo_model({str(tmp_path / 'demo.gguf')!r})
        def load(name):
            with gguf.open(p) as f:
                return f.records(name), f.raw("blk.0.attn_q.weight")
        with gguf.open(p) as f:
            copy = np.array(f.records("blk.0.attn_k.weight"))
            qcopy = np.array(f.raw("blk.0.attn_q.weight"))
        w, q = load("blk.0.attn_k.weight")
        junk = [np.full(1 << 18, k, np.float64) for k in range(64)]  # reuse freed address space
        gc.collect()
        x = np.random.default_rng(0).standard_normal(512).astype(np.float32)
        y = qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=2)
        want = qk.matmul(copy, x, lhs_format=qk.quant.q4_k)
        assert y.view(np.uint32).tolist() == want.view(np.uint32).tolist()
        assert np.array_equal(q.view(np.uint32), qcopy.view(np.uint32))
        f2 = gguf.open(p); r2 = f2.records("blk.0.attn_v.weight"); f2.close()
        assert f2.closed and r2.sum() >= 0
        try:
            f2.records("blk.0.attn_v.weight")
        except gguf.GGUFError as e:
            assert "closed" in str(e)
        else:
            raise AssertionError("records() after close()")
        print("views ok")
    """)
    assert r.returncode == 0 and "views ok" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_close_unmaps_when_no_view_is_alive(small):
    f = gguf.open(small)
    mm = f._mm
    v = f.records("k.weight")
    f.close()
    assert not mm.closed  # a live view holds it
    assert v.shape == (16, 1, 144)
    f = gguf.open(small)
    mm = f._mm
    for name in ("a.weight", "h.weight", "k.weight"):
        v = f.dequantize(name)
        v[0, 0] = 2.0  # a new, writable array, never a view of the map
    f.close()
    assert mm.closed  # nothing held it: unmapped at close()


# ------------------------------------------------------ 2. declared lengths vs remaining bytes

def hostile_files():
    big = 2**63
    arr_len = (B.s("k") + struct.pack("<I", B.ARRAY) + struct.pack("<IQ", B.UINT32, big))
    # a UINT32 entry (value 8) whose type was flipped to ARRAY: 8 reads as the item type
    # (STRING), the next entry's key length as the item count, its key bytes as lengths
    flipped = B.s("k") + struct.pack("<II", B.ARRAY, 8) + B.kv("general.name", B.STRING, "x" * 40)
    return {
        "array length 2^63": (B.build([arr_len]), "declares 9223372036854775808 UINT32 items"),
        "string-array length 2^63": (
            B.build([B.s("k") + struct.pack("<IIQ", B.ARRAY, B.STRING, big)]), "strings but only"),
        "scalar type flipped to ARRAY": (B.build([flipped], n_kv=1), "truncated or corrupt"),
        "string length 2^64-1": (B.build([B.s("k") + struct.pack("<IQ", B.STRING, 2**64 - 1)]),
                                 "needs 18446744073709551615 bytes"),
        "key length 2^40": (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**40) + bytes(64),
                            "key of 1099511627776 bytes"),
        "kv count 2^62": (B.build([], n_kv=2**62), "key-value pairs declared"),
        "tensor count 2^62": (B.build([], n_tensors=2**62), "tensors declared"),
        "nested arrays 1100 deep": (B.build([B.nested_array_kv("deep", 1100)]),
                                    "array of arrays"),
        "nested arrays 2 deep": (B.build([B.nested_array_kv("deep", 2)]), "array of arrays"),
        "unknown value type": (B.build([B.s("k") + struct.pack("<I", 13) + bytes(8)]),
                               "unknown value type 13"),
        "duplicate key": (B.build([B.kv("k", B.UINT8, 1), B.kv("k", B.UINT8, 2)]),
                          "appears twice"),
        "5 dimensions": (B.build([], [("t", (1, 1, 1, 1, 1), F32, bytes(4))]), "5 dimensions"),
        "unknown GGML type": (B.build([], [("t", (32,), 4, bytes(18))]), "unknown GGML type 4"),
        "negative dimension": (B.build([], [("t", (2**64 - 256,), F32, bytes(4))]),
                               "negative dimension"),
        "element count over 2^63": (B.build([], [("t", (2**62, 4), F32, bytes(4))]),
                                    "elements (over 2^63)"),
        "alignment 0": (B.build([B.kv("general.alignment", B.UINT32, 0)]),
                        "not a power of two"),
        "alignment as a string": (B.build([B.kv("general.alignment", B.STRING, "32")]),
                                  "not UINT32"),
        "version 1": (B.build([], version=1), "version 1 is not supported"),
        "bad UTF-8 key": (B.build([B.s(b"\xff\xfe") + struct.pack("<IB", B.UINT8, 1)]),
                          "not valid UTF-8"),
    }


@pytest.mark.parametrize("case", list(hostile_files()))
def test_hostile_header_is_rejected_at_once(case, tmp_path):
    data, match = hostile_files()[case]
    p = write(tmp_path, data)
    t0 = time.perf_counter()
    with pytest.raises(gguf.GGUFError, match=re.escape(match)) as e:
        gguf.open(p)
    assert time.perf_counter() - t0 < 2.0
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_legal_million_element_arrays_open_fast(tmp_path):
    n = 10**6
    kvs = [B.s("big.u32") + struct.pack("<IIQ", B.ARRAY, B.UINT32, n)
           + np.arange(n, dtype="<u4").tobytes(),
           B.s("big.f64") + struct.pack("<IIQ", B.ARRAY, B.FLOAT64, n)
           + np.ones(n, "<f8").tobytes(),
           B.kv("big.words", B.ARRAY, (B.STRING, [f"w{i}" for i in range(50_000)]))]
    p = write(tmp_path, B.build(kvs))
    t0 = time.perf_counter()
    with gguf.open(p) as f:
        opened = time.perf_counter() - t0
        meta = f.metadata
    assert opened < 2.0, opened  # gguf-py's reader: 10-14 s and 1 GB for one such array
    tracemalloc.start()  # (slows the parse ~50x, so timed apart)
    gguf.open(p).close()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert meta["big.u32"][123456] == 123456 and len(meta["big.f64"]) == n
    assert meta["big.words"][49_999] == "w49999"


def test_fuzz_corpus_opens_or_is_rejected_in_one_line(tmp_path):
    """300 deterministic mutants of a small file: each opens and reads, or raises GGUFError,
    within 10 s (SIGALRM: a hang is caught; a mutant that retypes a tensor may still meet a
    cold JIT compile of another format's kernel on a loaded core), never another exception."""
    data, header_end = gguf_fuzz.make_seed_file(tmp_path / "seed.gguf")
    # Compile (or load from numba's cache) every kernel the seed's tensors use before any alarm
    # is set: a cold JIT compile on a loaded CI core can take seconds.
    with gguf.open(tmp_path / "seed.gguf") as f:
        for t in f.tensors:
            f.dequantize(t.name)

    class Hang(BaseException):
        pass

    def on_alarm(*_):
        raise Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    counts = {"ok": 0, "rejected": 0}
    try:
        for i, m in enumerate(gguf_fuzz.make_mutants(data, header_end, 300, seed=7)):
            p = write(tmp_path, m, f"m{i}.gguf")
            signal.setitimer(signal.ITIMER_REAL, 10.0)
            try:
                with gguf.open(p) as f:
                    _ = f.metadata
                    for t in f.tensors:
                        try:
                            f.dequantize(t.name)
                        except gguf.GGUFError:
                            pass
                counts["ok"] += 1
            except gguf.GGUFError as e:
                assert "\n" not in str(e)
                counts["rejected"] += 1
            except Hang:
                pytest.fail(f"mutant {i} hangs")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            p.unlink()
    finally:
        signal.signal(signal.SIGALRM, old)
    assert counts["ok"] > 10 and counts["rejected"] > 100, counts


@pytest.mark.slow
def test_fuzz_2000_files_no_hang_crash_or_traceback(request):
    """Run with ``pytest -m slow`` (or NUMBA_QK_SLOW=1): 2,000 mutants in worker processes."""
    if request.config.option.markexpr != "slow" and not os.environ.get("NUMBA_QK_SLOW"):
        pytest.skip("slow: run with -m slow or NUMBA_QK_SLOW=1")
    res = gguf_fuzz.run(2000, 3.0, str(ROOT))
    bad = {k: v for k, v in res["counts"].items() if k not in ("ok", "rejected")}
    assert not bad, res


# ------------------------------------------------------------ 3. alignment and byte order

@pytest.mark.parametrize("alignment", [8, 16, 32, 64, 256])
def test_quantize_honours_the_input_alignment(alignment, small, tmp_path):
    rng = np.random.default_rng(alignment)
    a = rng.standard_normal((4, 256)).astype(np.float32)
    kvs = [B.kv("general.alignment", B.UINT32, alignment),
           B.kv("general.architecture", B.STRING, "llama")]
    tensors = [("n.weight", (3,), F32, f32_bytes([1, 2, 3])),  # odd size: forces padding
               ("a.weight", (256, 4), F32, f32_bytes(a)),
               ("b.weight", (5,), F32, f32_bytes(np.arange(5)))]
    src = write(tmp_path, B.build(kvs, tensors, alignment=alignment), "in.gguf")
    out = tmp_path / "out.gguf"
    gguf.quantize_file(src, out)
    with gguf.open(out) as f:
        assert f.alignment == alignment
        assert f.metadata["general.alignment"] == alignment
        assert_same_records(f.records("a.weight").reshape(-1, 144), qk.quantize(a, format=Q4K))
        assert_same_f32(f.dequantize("n.weight"), np.array([1, 2, 3], np.float32))
        assert_same_f32(f.dequantize("b.weight"), np.arange(5, dtype=np.float32))
    r = gguf_py.GGUFReader(out)  # an independent reader agrees on the layout
    byname = {t.name: t for t in r.tensors}
    assert np.array_equal(np.asarray(byname["b.weight"].data), np.arange(5, dtype=np.float32))
    assert bytes(byname["a.weight"].data) == qk.quantize(a, format=Q4K).tobytes()


def test_big_endian_files_read_and_quantize_refuses(tmp_path):
    a = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    q = qk.quantize(a, format=Q4K)
    kvs = [B.kv("general.architecture", B.STRING, "llama", o=">"),
           B.kv("x.u32", B.UINT32, 258, o=">")]
    data = B.build(kvs, [("a.weight", (256, 2), F32, a.astype(">f4").tobytes()),
                         ("k.weight", (256, 2), Q4_K, q.tobytes())], o=">")
    src = write(tmp_path, data)
    with gguf.open(src) as f:
        assert f.big_endian and f.metadata["x.u32"] == 258
        assert_same_f32(f.dequantize("a.weight"), a)
        with pytest.raises(gguf.GGUFError, match="big-endian"):
            f.records("k.weight")
        # what records()/matmul refuse is not listed as accelerated (inspect's column)
        assert f.tensor("k.weight").format is Q4K and not f.tensor("k.weight").accelerated
    out = tmp_path / "out.gguf"
    with pytest.raises(gguf.GGUFError, match="big-endian GGUF files are not supported"):
        gguf.quantize_file(src, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.gguf"]


# ------------------------------------------------------------------ 4. the output file

def test_output_is_never_the_input(small, tmp_path):
    src = tmp_path / "d1" / "in.gguf"
    src.parent.mkdir()
    src.write_bytes(small.read_bytes())
    before = src.read_bytes()
    (tmp_path / "d2").symlink_to(tmp_path / "d1", target_is_directory=True)
    os.link(src, tmp_path / "hard.gguf")
    for dst in (src, str(src), tmp_path / "d2" / "in.gguf", tmp_path / "d1" / ".." / "d1" /
                "in.gguf", tmp_path / "hard.gguf"):
        with pytest.raises(gguf.GGUFError, match="is the input"):
            gguf.quantize_file(src, dst)
    assert src.read_bytes() == before
    assert not [p for p in (tmp_path / "d1").iterdir() if "numba_qk-tmp" in p.name]


def test_output_symlink_fifo_directory_are_refused(small, tmp_path):
    other = tmp_path / "other.gguf"
    other.write_bytes(b"keep")
    (tmp_path / "link.gguf").symlink_to(other)
    (tmp_path / "to_input.gguf").symlink_to(small)
    os.mkfifo(tmp_path / "fifo.gguf")
    (tmp_path / "dir.gguf").mkdir()
    for name, match in [("link.gguf", "is a symbolic link"), ("to_input.gguf", "is the input"),
                        ("fifo.gguf", "is a FIFO"), ("dir.gguf", "is a directory")]:
        with pytest.raises(gguf.GGUFError, match=match):
            gguf.quantize_file(small, tmp_path / name)
    assert other.read_bytes() == b"keep" and (tmp_path / "link.gguf").is_symlink()
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo.gguf").st_mode)
    with pytest.raises(gguf.GGUFError, match="does not exist"):
        gguf.quantize_file(small, tmp_path / "nodir" / "x.gguf")
    with pytest.raises(gguf.GGUFError, match="not a regular file"):
        gguf.open(tmp_path / "fifo.gguf")  # returns at once: a FIFO is never opened


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_output_mode_follows_the_umask_and_is_fsynced_before_rename(umask, small, tmp_path,
                                                                     monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"),
                                                     real_replace(a, b))[1])
    old = os.umask(umask)
    try:
        gguf.quantize_file(small, tmp_path / "o.gguf")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "o.gguf").st_mode) == 0o666 & ~umask
    assert events[:2] == ["fsync", "replace"]


# --------------------------------------------------------------- 5. one-line errors, zero dims

def zero_dim_file():
    return B.build([B.kv("general.architecture", B.STRING, "llama")],
                   [("zero_rows.weight", (256, 0), Q4_K, b""),
                    ("zero_cols.weight", (0, 4), Q4_K, b""),
                    ("f32_zero_rows.weight", (256, 0), F32, b""),
                    ("ok.weight", (256, 8), Q4_K,
                     qk.quantize(np.ones((8, 256), np.float32), format=Q4K).tobytes())])


def test_zero_dimension_tensors_are_legal(tmp_path):
    src = write(tmp_path, zero_dim_file())
    with gguf.open(src) as f:
        assert f.records("zero_rows.weight").shape == (0, 1, 144)
        assert f.records("zero_cols.weight").shape == (4, 0, 144)
        assert f.dequantize("zero_rows.weight").shape == (0, 256)
        assert f.dequantize("f32_zero_rows.weight").shape == (0, 256)
        assert f.matmul("zero_rows.weight", np.ones(256, np.float32)).shape == (0,)
        for batch in (1, 2, 8, 9):                    # batch >= 2 raised range() step zero
            assert f.matmul("zero_rows.weight", np.ones((batch, 256), np.float32),
                            threads=2).shape == (batch, 0)
        assert_same_f32(f.matmul("zero_cols.weight", np.ones(0, np.float32)), np.zeros(4))
    out = tmp_path / "o.gguf"
    res = {r.name: r for r in gguf.quantize_file(src, out)}
    assert res["f32_zero_rows.weight"].type_after == "Q4_K"
    with gguf.open(out) as f:
        assert f.records("f32_zero_rows.weight").shape == (0, 1, 144)
        assert f.tensor("zero_cols.weight").shape == (4, 0)


def test_cli_on_zero_dims_and_hostile_files_is_one_line(tmp_path, capsys):
    zero = write(tmp_path, zero_dim_file(), "zero.gguf")
    code, out, err = cli(capsys, "inspect", zero)
    assert code == 0 and "zero_rows.weight" in out, err
    code, out, err = cli(capsys, "quantize", zero, tmp_path / "zq.gguf")
    assert code == 0 and "1 tensors converted" in out, err
    code, out, err = cli(capsys, "bench", "--repeat", "1", zero)
    assert code == 0 and "ok.weight" in out, err
    deep = write(tmp_path, B.build([B.nested_array_kv("deep", 1100)]), "deep.gguf")
    hostile = write(tmp_path, hostile_files()["array length 2^63"][0], "len.gguf")
    for p, match in [(deep, "array of arrays"), (hostile, "declares")]:
        for cmd in (["inspect", p], ["quantize", p, tmp_path / "x.gguf"], ["bench", p]):
            code, out, err = cli(capsys, *cmd)
            assert_one_line_error(code, err, match)
    code, out, err = cli(capsys, "quantize", zero, zero)
    assert_one_line_error(code, err, "is the input")
    assert not (tmp_path / "x.gguf").exists()


# ------------------------------------------------------------ 6. signals and temporary files

def test_sigterm_during_quantize_removes_the_temporary_file(small, tmp_path):
    out = tmp_path / "out.gguf"
    r = run_py(f"""
        import os, signal
        from numba_qk import gguf
        def progress(line):
            os.kill(os.getpid(), signal.SIGTERM)  # mid-write, after the first tensor
        gguf.quantize_file({str(small)!r}, {str(out)!r}, progress=progress)
        print("not reached")
    """)
    assert r.returncode == -signal.SIGTERM, (r.returncode, r.stdout, r.stderr)
    assert "not reached" not in r.stdout
    assert os.listdir(tmp_path) == []


def test_stale_temporaries_of_dead_runs_are_removed_live_ones_kept(small, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".out.gguf.numba_qk-tmp-{dead.pid}-0123abcd"
        busy = tmp_path / f".out.gguf.numba_qk-tmp-{live.pid}-4567abcd"
        unrelated = tmp_path / ".other.gguf.numba_qk-tmp-1-00000000"
        for p in (stale, busy, unrelated):
            p.write_bytes(b"partial")
        lines = []
        gguf.quantize_file(small, tmp_path / "out.gguf", progress=lines.append)
        assert not stale.exists() and busy.exists() and unrelated.exists()
        assert any("stale temporary" in ln and str(dead.pid) in ln for ln in lines)
        assert any("still running" in ln and str(live.pid) in ln for ln in lines)
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("length", [200, 227, 240, 255])
def test_long_legal_output_names_quantize(small, tmp_path, length):
    """Output names of up to NAME_MAX bytes are legal: the temporary beside it must be too
    (its name added 29 bytes; 227-255-byte names failed, the error naming the temp file)."""
    name = "m" * (length - len(".gguf")) + ".gguf"
    out = tmp_path / name
    lines = []
    gguf.quantize_file(small, out, progress=lines.append)
    assert sorted(os.listdir(tmp_path)) == [name]
    with gguf.open(out) as f:
        assert f.tensors
    # a stale temporary of a dead run of that same long name is still found and removed
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{gguf._temp_prefix(out)}{dead.pid}-0123abcd"
    assert len(stale.name.encode()) <= 255
    stale.write_bytes(b"partial")
    gguf.quantize_file(small, out, progress=lines.append)
    assert sorted(os.listdir(tmp_path)) == [name]


# ------------------------------------------------------------------- 7. fork after threads

def _fork_child_result(w, x, want):
    qk.matmul(w, x, lhs_format=Q4K, threads=2)  # the parent uses the thread pool first
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            y = qk.matmul(w, x, lhs_format=Q4K, threads=2)
            os._exit(0 if y.view(np.uint32).tolist() == want.view(np.uint32).tolist() else 3)
        finally:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_fork_child_after_threads_computes_the_right_result():
    rng = np.random.default_rng(5)
    w = qk.quantize(rng.standard_normal((128, 256)).astype(np.float32), format=Q4K)
    w = w.reshape(64, 2, 144)
    x = rng.standard_normal(512).astype(np.float32)
    want = qk.matmul(w, x, lhs_format=Q4K, threads=1)
    assert _fork_child_result(w, x, want) == 0
    # the parent's pool still works after the fork
    assert_same_f32(qk.matmul(w, x, lhs_format=Q4K, threads=2), want)


def test_threads_never_start_numbas_threading_layer():
    r = run_py("""
        import numba, numpy as np, numba_qk as qk
        rng = np.random.default_rng(5)
        w = qk.quantize(rng.standard_normal((128, 256)).astype(np.float32),
                        format=qk.quant.q4_k).reshape(64, 2, 144)
        x = rng.standard_normal((3, 512)).astype(np.float32)
        qk.matmul(w, x[0], lhs_format=qk.quant.q4_k, threads=2)
        qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=None)
        qk.astype(x, qk.bf16, threads=2)
        try:
            numba.threading_layer()
        except ValueError:
            print("no layer")
    """)
    assert r.returncode == 0 and "no layer" in r.stdout, (r.stdout, r.stderr)


# ------------------------------------------------------------------------- 8. streaming

def test_quantize_streams_in_bounded_chunks_and_stays_exact(tmp_path, monkeypatch):
    rows, cols = 96, 1024  # 384 KiB of f32; 48 KiB chunks -> 8 chunks, the last one partial
    a = np.random.default_rng(8).standard_normal((rows, cols)).astype(np.float32)
    src = write(tmp_path, B.build([B.kv("general.architecture", B.STRING, "llama")],
                                  [("a.weight", (cols, rows), F32, f32_bytes(a)),
                                   ("b.weight", (cols, rows), F16, a.astype("<f2").tobytes())]))
    monkeypatch.setattr(gguf, "CHUNK_BYTES", 7 * 7 * 1024)
    out = tmp_path / "o.gguf"
    tracemalloc.start()
    res = gguf.quantize_file(src, out)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * gguf.CHUNK_BYTES, peak  # before: ~4.3x the tensor (1.6 MiB here)
    want = qk.quantize(a.reshape(-1, 256), format=Q4K)
    back = qk.dequantize(want, Q4K).reshape(a.shape).astype(np.float64)
    rms = np.sqrt(np.mean((back - a) ** 2)) / np.sqrt(np.mean(a.astype(np.float64) ** 2))
    assert res[0].rms_error == pytest.approx(rms, rel=1e-9)
    with gguf.open(out) as f:
        assert_same_records(f.records("a.weight").reshape(-1, 144), want)
        want_h = qk.quantize(a.astype(np.float16).astype(np.float32).reshape(-1, 256), format=Q4K)
        assert_same_records(f.records("b.weight").reshape(-1, 144), want_h)


def test_non_finite_input_names_the_tensor_and_block(tmp_path, monkeypatch):
    a = np.zeros((4, 256), np.float32)
    a[3, 5] = np.nan
    src = write(tmp_path, B.build([], [("a.weight", (256, 4), F32, f32_bytes(a))]))
    monkeypatch.setattr(gguf, "CHUNK_BYTES", 1024)  # one block per chunk
    with pytest.raises(gguf.GGUFError, match=r"tensor 'a.weight': block 3 \(of 4\)"):
        gguf.quantize_file(src, tmp_path / "o.gguf")
    assert os.listdir(tmp_path) == ["t.gguf"]


# ------------------------------------------------------------------------- 9. smaller items

def test_metadata_is_copied_byte_for_byte(tmp_path):
    kvs = [B.kv("general.architecture", B.UINT32, 5),  # not a string: copied as it is
           B.kv("e.u32", B.ARRAY, (B.UINT32, [])), B.kv("e.str", B.ARRAY, (B.STRING, [])),
           B.kv("i.i8", B.INT8, -3), B.kv("i.f64", B.FLOAT64, -0.0),
           B.kv("i.words", B.ARRAY, (B.STRING, ["\u00e9", "a b"]))]
    a = np.ones((1, 256), np.float32)
    src = write(tmp_path, B.build(kvs, [("a.weight", (256, 1), F32, f32_bytes(a))]))
    out = tmp_path / "o.gguf"
    gguf.quantize_file(src, out)
    with gguf.open(src) as f, gguf.open(out) as g:
        assert g.metadata == f.metadata
        assert g.metadata["e.u32"] == [] and g.metadata["general.architecture"] == 5
        kv_src = b"".join(f._mm[kv.start:kv.end] for kv in f._kvs.values())
        kv_out = b"".join(g._mm[kv.start:kv.end] for kv in g._kvs.values())
        assert kv_src == kv_out


def test_q8_1_tensors_use_ggml_36_byte_blocks(tmp_path):
    a = np.random.default_rng(9).standard_normal((6, 32)).astype(np.float32)
    q = qk.quantize(a, format=qk.quant.q8_1)
    assert q.shape == (6, 36)
    src = write(tmp_path, B.build([], [("q.weight", (64, 3), Q8_1, q.tobytes()),
                                       ("after.weight", (4,), F32, f32_bytes([1, 2, 3, 4]))]))
    with gguf.open(src) as f:
        t = f.tensor("q.weight")
        assert t.nbytes == 6 * 36 and t.format is qk.quant.q8_1 and not t.accelerated
        assert_same_records(f.records("q.weight").reshape(-1, 36), q)
        assert_same_f32(f.dequantize("q.weight"), qk.dequantize(q, qk.quant.q8_1).reshape(3, 64))
        assert_same_f32(f.dequantize("after.weight"), np.array([1, 2, 3, 4], np.float32))


def _two(offsets, sizes=(1024, 1024)):
    return B.build([], [("a", (sizes[0] // 4,), F32, bytes(sizes[0])),
                        ("b", (sizes[1] // 4,), F32, bytes(sizes[1]))], offsets=offsets)


@pytest.mark.parametrize("offsets, match", [
    ((0, 512), "overlap"), ((0, 0), "overlap"), ((1024, 512), "overlap"),
    ((0, 1028), "not a multiple of the alignment 32"),
    ((0, 2**64 - 32), "truncated or corrupt"),       # start + size would wrap past 2^64 in C
    ((2**64 - 1024, 1024), "not a multiple|truncated or corrupt"),
])
def test_tampered_offsets_are_rejected(offsets, match, tmp_path):
    with pytest.raises(gguf.GGUFError, match=match):
        gguf.open(write(tmp_path, _two(offsets)))


def test_legal_gaps_between_tensors_are_accepted(tmp_path):
    data = bytearray(_two((0, 2048)))
    with gguf.open(write(tmp_path, bytes(data) + bytes(2048))) as f:
        assert [t.nbytes for t in f.tensors] == [1024, 1024]


def test_threads_default_is_one():
    import inspect

    for fn in (qk.matmul, qk.gemv, qk.gemm, gguf.GGUFFile.matmul):
        assert inspect.signature(fn).parameters["threads"].default == 1
