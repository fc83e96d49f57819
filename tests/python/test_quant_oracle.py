"""Oracle tests for src/quant through tests/probes/quant_probe.

* Dequantize: random blocks of every type gguf-py can dequantize must give
  gguf-py's floats bit for bit (f16 against numpy's conversion).
* Quantize: for every type gguf-py can quantize (q4_0, q4_1, q5_0, q5_1,
  q8_0, bf16) our bytes must equal gguf-py's bytes; f16 against numpy.
* q8_1 and q8_K have no gguf-py oracle: an independent numpy version of the
  format definition below must agree bit for bit.
* K-quant quantizers (no oracle in gguf-py): the stored levels must be the
  ones the format's final requantization gives for the stored scales, the
  error must stay within the type's bound, and the scale search must beat a
  plain min/max quantizer and come close to a brute-force scale grid.

Inputs are fresh every run; the seed is printed and TERN_TEST_SEED replays it.
"""
import os
import secrets
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants

SEED = int(os.environ.get("TERN_TEST_SEED", secrets.randbits(32)))
print(f"quant oracle tests: seed {SEED} (set TERN_TEST_SEED to replay)")

_BUILD = Path(os.environ.get("TERN_BUILD", Path(__file__).resolve().parents[2] / "build"))
PROBE = _BUILD / "probes" / "quant_probe"

# Elements and bytes per block.
BLOCK = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24),
    "q8_0": (32, 34), "q8_1": (32, 36),
    "q2_K": (256, 84), "q3_K": (256, 110), "q4_K": (256, 144), "q5_K": (256, 176),
    "q6_K": (256, 210), "q8_K": (256, 292),
}


@pytest.fixture
def rng(request):
    """A generator per test, derived from the run's seed and the test's name."""
    return np.random.default_rng([SEED, *request.node.name.encode()])


def _run_probe(mode, name, data):
    if not PROBE.exists():
        pytest.fail(f"{PROBE} not built (set TERN_BUILD to the build directory)")
    res = subprocess.run([str(PROBE), mode, name], input=data, capture_output=True)
    if res.returncode != 0:
        pytest.fail(f"quant_probe {mode} {name} failed: {res.stderr.decode()}")
    return res.stdout


def our_quantize(name, x):
    out = _run_probe("quantize", name, np.ascontiguousarray(x, dtype=np.float32).tobytes())
    return np.frombuffer(out, dtype=np.uint8).reshape(-1, BLOCK[name][1])


def our_dequantize(name, blocks):
    out = _run_probe("dequantize", name, np.ascontiguousarray(blocks, dtype=np.uint8).tobytes())
    return np.frombuffer(out, dtype=np.float32)


def random_half_bits(rng, n):
    """Random finite f16 bit patterns (normals, subnormals, zeros of both signs)."""
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    inf_or_nan = (h & 0x7C00) == 0x7C00
    h[inf_or_nan] &= np.uint16(0xBFFF)
    return h


def roundf(v):
    """C roundf (half away from zero), exact for float32 input."""
    a = np.abs(v)
    f = np.floor(a)
    return np.copysign(f + (a - f >= 0.5), v)


def first_difference(a, b):
    bad = np.nonzero((a != b).any(axis=1))[0]
    return None if len(bad) == 0 else (int(bad[0]), len(bad))


def distributions(rng, n, block):
    """Named float32 inputs of n values: smooth data, outliers, exact ties,
    constant and zero blocks, tiny and large magnitudes."""
    normal = rng.standard_normal(n)
    per_block = lambda v: np.repeat(v, block)[:n]
    out = {
        "normal": normal,
        "uniform": rng.uniform(-1, 1, n),
        "weights": 0.02 * normal,
        "tiny": 1e-3 * rng.standard_normal(n),
        "large": 3e3 * rng.standard_normal(n),
        "positive": np.abs(normal) + 0.5,
        "outliers": normal * np.where(rng.random(n) < 0.01, 50.0, 1.0),
        "integers": rng.integers(-8, 9, n).astype(np.float64),
        "halves": rng.integers(-16, 17, n) / 2.0,
        "constant blocks": per_block(rng.standard_normal(n // block + 1)),
        "sparse": normal * (rng.random(n) < 0.1),
        "zero runs": normal * per_block(rng.random(n // block + 1) < 0.5),
        "zeros": np.zeros(n),
    }
    return {k: v.astype(np.float32) for k, v in out.items()}


# Offsets of the f16 fields in each block; random bytes elsewhere.
HALF_FIELDS = {
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q8_1": [0, 2],
    "q2_K": [80, 82], "q3_K": [108], "q4_K": [0, 2], "q5_K": [0, 2], "q6_K": [208],
}
GGUF_DEQUANTIZE = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]
GGUF_QUANTIZE = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]


def qtype(name):
    return QT[name.upper()]


def random_blocks(rng, name, n_blocks):
    """Random bytes with finite f16 scales: every bit pattern of the level and
    scale fields is legal, so random bytes exercise the whole layout."""
    size = BLOCK[name][1]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in HALF_FIELDS.get(name, []):
        blocks[:, off:off + 2] = random_half_bits(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if name == "q8_K":
        d = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-6, 3, n_blocks)).astype(np.float32)
        blocks[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    return blocks


def assert_same_floats(ours, ref, what):
    ours = np.ascontiguousarray(ours, dtype=np.float32).ravel()
    ref = np.ascontiguousarray(ref, dtype=np.float32).ravel()
    assert ours.shape == ref.shape, what
    same = ours.view(np.uint32) == ref.view(np.uint32)
    if not same.all():
        i = int(np.argmin(same))
        pytest.fail(f"{what}: {np.count_nonzero(~same)} of {ours.size} values differ; first at "
                    f"element {i}: ours {ours[i]!r} ({ours.view(np.uint32)[i]:#010x}) vs "
                    f"reference {ref[i]!r} ({ref.view(np.uint32)[i]:#010x}); seed {SEED}")


def assert_same_bytes(ours, ref, name, what):
    ours = np.asarray(ours, dtype=np.uint8).reshape(-1, BLOCK[name][1])
    ref = np.asarray(ref, dtype=np.uint8).reshape(-1, BLOCK[name][1])
    diff = first_difference(ours, ref)
    if diff is not None:
        b, n_bad = diff
        pytest.fail(f"{name} {what}: {n_bad} of {len(ours)} blocks differ; first block {b}:\n"
                    f"  ours      {ours[b].tobytes().hex()}\n  reference {ref[b].tobytes().hex()}\n"
                    f"seed {SEED}")


@pytest.mark.parametrize("name", GGUF_DEQUANTIZE)
def test_dequantize_matches_gguf(rng, name):
    blocks = random_blocks(rng, name, 4096)
    ref = quants.dequantize(blocks, qtype(name))
    assert_same_floats(our_dequantize(name, blocks), ref, f"{name} dequantize")


def test_dequantize_bf16_matches_gguf(rng):
    bits = rng.integers(0, 65536, size=(1, 65536 * 2), dtype=np.uint16)  # NaNs included
    ref = quants.dequantize(bits.view(np.uint8), QT.BF16)
    assert_same_floats(our_dequantize("bf16", bits.view(np.uint8)), ref, "bf16 dequantize")


def test_dequantize_f16_and_f32_match_numpy(rng):
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ours = our_dequantize("f16", halves.view(np.uint8))
    ref = halves.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan), f"f16 NaNs; seed {SEED}"
    assert_same_floats(ours[~nan], ref[~nan], "f16 dequantize")
    raw = rng.integers(0, 2**32, size=4096, dtype=np.uint32)
    assert np.array_equal(our_dequantize("f32", raw.view(np.uint8)).view(np.uint32), raw)


def test_dequantize_q8_1_and_q8_K_match_format_definition(rng):
    # q8_1: x = d * q (the stored sum s plays no part).
    blocks = random_blocks(rng, "q8_1", 4096)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 4:36].view(np.int8).astype(np.float32)
    assert_same_floats(our_dequantize("q8_1", blocks), d * q, "q8_1 dequantize")
    # q8_K: x = d * q with a float d; bsums play no part.
    blocks = random_blocks(rng, "q8_K", 2048)
    d = blocks[:, 0:4].copy().view(np.float32)
    q = blocks[:, 4:260].view(np.int8).astype(np.float32)
    assert_same_floats(our_dequantize("q8_K", blocks), d * q, "q8_K dequantize")


def c_reference_zero_signs(name, x):
    """The f16 bits the C reference stores for zero scale fields of each block,
    (d, m) with None where the field is not a zero. The C loops decide the
    sign of a zero: q4_0/q5_0 start from max = +0 and replace it only on a
    strictly larger magnitude, so an all-zero block gets d = +0 / -8 = -0;
    q4_1/q5_1 keep the first element that is strictly below the running
    min, so a zero min has the sign of the first zero, and d = max - min."""
    x = x.reshape(-1, 32)
    if name in ("q4_0", "q5_0"):
        allzero = (x == 0).all(axis=1)
        return [(0x8000 if z else None, None) for z in allzero]
    out = []
    for row in x:
        if row.min() != 0:
            out.append((None, None))
            continue
        m_sign = 0x8000 if np.signbit(row[np.nonzero(row == 0)[0][0]]) else 0
        # d = (max - min) / 15 is zero only for an all-zero block, where max
        # and min are the same first zero and their difference is +0.
        out.append((0 if row.max() == 0 else None, m_sign))
    return out


def assert_same_bytes_up_to_zero_sign(ours, ref, x, name, what):
    """Bytes must match gguf-py's except in one documented way: gguf-py picks
    the sign of a zero d or m with numpy's argmax/min, which can differ from
    the C reference's loop (see c_reference_zero_signs). In those blocks the
    field must be +-0 in both, every other byte must match, and ours must be
    the sign the C reference stores."""
    ours = np.asarray(ours, dtype=np.uint8).reshape(-1, BLOCK[name][1])
    ref = np.asarray(ref, dtype=np.uint8).reshape(-1, BLOCK[name][1])
    fields = HALF_FIELDS[name]  # d, then m for the formats with a min
    bad = np.nonzero((ours != ref).any(axis=1))[0]
    if len(bad) == 0:
        return
    zero_signs = c_reference_zero_signs(name, x)
    for b in bad:
        o, r = ours[b].copy(), ref[b].copy()
        for k, off in enumerate(fields):
            ho = int(o[off]) | int(o[off + 1]) << 8
            hr = int(r[off]) | int(r[off + 1]) << 8
            if ho != hr and (ho & 0x7FFF) == 0 and (hr & 0x7FFF) == 0:
                want = zero_signs[b][k]
                assert want is not None and ho == want, (
                    f"{name} {what}: block {b} field {k} is {ho:#06x}, the C reference stores "
                    f"{want}; seed {SEED}")
                o[off + 1] &= 0x7F
                r[off + 1] &= 0x7F
        if not np.array_equal(o, r):
            pytest.fail(f"{name} {what}: {len(bad)} of {len(ours)} blocks differ; block {b}:\n"
                        f"  ours      {ours[b].tobytes().hex()}\n  reference {ref[b].tobytes().hex()}\n"
                        f"seed {SEED}")


@pytest.mark.parametrize("name", GGUF_QUANTIZE)
def test_quantize_matches_gguf(rng, name):
    for dist, x in distributions(rng, 4096 * 32, 32).items():
        ref = quants.quantize(x.reshape(-1, 32), qtype(name))
        assert_same_bytes_up_to_zero_sign(our_quantize(name, x), ref, x, name, f"quantize of {dist} data")


def test_quantize_bf16_matches_gguf(rng):
    bits = rng.integers(0, 2**32, size=1 << 18, dtype=np.uint32)  # every class: NaN, inf, subnormal
    x = bits.view(np.float32)
    ref = quants.quantize(x.reshape(1, -1), QT.BF16)
    assert_same_bytes(our_quantize("bf16", x), ref, "bf16", "quantize of random bit patterns")
    for dist, x in distributions(rng, 1 << 16, 256).items():
        ref = quants.quantize(x.reshape(1, -1), QT.BF16)
        assert_same_bytes(our_quantize("bf16", x), ref, "bf16", f"quantize of {dist} data")


def test_quantize_f16_matches_numpy(rng):
    # Exponents from below the f16 subnormals to past its overflow, so every
    # rounding path (subnormal, normal, carry into the exponent, to infinity) runs.
    n = 1 << 18
    bits = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    exp = rng.integers(96, 146, size=n, dtype=np.uint32)
    bits = (bits & np.uint32(0x807FFFFF)) | (exp << np.uint32(23))
    x = bits.view(np.float32)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint8)
    assert_same_bytes(our_quantize("f16", x), ref, "f16", "quantize of random floats")
    # NaN stays NaN (payload bits are not specified by numpy).
    nan = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF], dtype=np.uint32).view(np.float32)
    assert np.isnan(our_quantize("f16", nan).view(np.float16)).all()


# -- independent numpy versions of q8_1 and q8_K, from the format definition --

def q8_1_reference(x):
    x = x.reshape(-1, 32)
    amax = np.abs(x).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = roundf((x * inv).astype(np.float32)).astype(np.int8)
    s = (q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32) * d).astype(np.float32)
    with np.errstate(over="ignore"):  # s overflows f16 to inf for large blocks, as in C
        halves = [d.astype(np.float16).view(np.uint8), s.astype(np.float16).view(np.uint8)]
    return np.concatenate([*halves, q.view(np.uint8)], axis=1)


def q8_K_reference(x):
    x = x.reshape(-1, 256)
    n = len(x)
    idx = np.abs(x).argmax(axis=1)  # first of the largest magnitudes
    signed_max = x[np.arange(n), idx].astype(np.float32)
    zero = signed_max == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127) / signed_max).astype(np.float32)
        d = np.where(zero, np.float32(0), np.float32(1) / iscale).astype(np.float32)
    # Round half to even, as the reference's integer rounding does.
    q = np.minimum(np.rint((iscale[:, None] * x).astype(np.float32)), 127).astype(np.int8)
    bsums = q.astype(np.int16).reshape(n, 16, 16).sum(axis=2).astype(np.int16)
    return np.concatenate([d.reshape(n, 1).view(np.uint8), q.view(np.uint8),
                           bsums.view(np.uint8)], axis=1)


@pytest.mark.parametrize("name,reference", [("q8_1", q8_1_reference), ("q8_K", q8_K_reference)])
def test_quantize_q8_activation_formats_match_numpy(rng, name, reference):
    elems = BLOCK[name][0]
    for dist, x in distributions(rng, 2048 * 256, elems).items():
        assert_same_bytes(our_quantize(name, x), reference(x), name, f"quantize of {dist} data")


# -- K-quant quantizers: requantization fixed point and scale-search quality --
#
# Each K format is described by: elements per sub-block, the level range, and
# a parser that returns per block the levels (0..top), the effective scale
# d * sc and offset dmin * m of each sub-block (float32, as the format
# computes them), and the level offset of symmetric formats.

def _halves(blocks, off):
    return blocks[:, off:off + 2].copy().view(np.float16).astype(np.float32)


def _two_bit_planes(qs):
    """q2_K / q3_K: element 128h + 32p + l is bits 2p of qs[32h + l]."""
    n = len(qs)
    planes = qs.reshape(n, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    return (planes & 3).reshape(n, 256).astype(np.int32)


def _scale_min_k4(scales):
    """q4_K / q5_K 6-bit scales and mins, element j of 0..7."""
    s = scales.astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def parse_q2_K(b):
    sc = b[:, 0:16]
    d, dmin = _halves(b, 80), _halves(b, 82)
    return (_two_bit_planes(b[:, 16:80]), d * (sc & 0xF).astype(np.float32),
            dmin * (sc >> 4).astype(np.float32))


def parse_q3_K(b):
    n = len(b)
    low = _two_bit_planes(b[:, 32:96])
    high = (b[:, 0:32].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    s = b[:, 96:108].astype(np.int32)
    j = np.arange(16)
    lo4 = np.where(j < 8, s[:, j % 8] & 0xF, s[:, j % 8] >> 4)
    hi2 = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    sc = ((lo4 | (hi2 << 4)) - 32).astype(np.float32)
    return low + 4 * high.reshape(n, 256).astype(np.int32), _halves(b, 108) * sc, None


def parse_q4_K(b):
    n = len(b)
    q = b[:, 16:144].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    sc, mn = _scale_min_k4(b[:, 4:16])
    return (q & 0xF).reshape(n, 256).astype(np.int32), _halves(b, 0) * sc, _halves(b, 2) * mn


def parse_q5_K(b):
    n = len(b)
    q = b[:, 48:176].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    high = (b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    levels = (q & 0xF).reshape(n, 256).astype(np.int32) + 16 * high.reshape(n, 256).astype(np.int32)
    sc, mn = _scale_min_k4(b[:, 4:16])
    return levels, _halves(b, 0) * sc, _halves(b, 2) * mn


def parse_q6_K(b):
    n = len(b)
    ql = b[:, 0:128].reshape(n, 2, 64).astype(np.int32)
    qh = b[:, 128:192].reshape(n, 2, 32).astype(np.int32)
    parts = [(ql[:, :, 0:32] & 0xF) | ((qh & 3) << 4),
             (ql[:, :, 32:64] & 0xF) | (((qh >> 2) & 3) << 4),
             (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4),
             (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)]
    levels = np.stack(parts, axis=2).reshape(n, 256)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    return levels, _halves(b, 208) * sc, None


# name: (parser, sub-block size, lowest level, highest level, symmetric offset, bits of sub-scale)
K_FORMATS = {
    "q2_K": (parse_q2_K, 16, 0, 3, 0, 4),
    "q3_K": (parse_q3_K, 16, -4, 3, 4, 6),
    "q4_K": (parse_q4_K, 32, 0, 15, 0, 6),
    "q5_K": (parse_q5_K, 32, 0, 31, 0, 6),
    "q6_K": (parse_q6_K, 16, -32, 31, 32, 8),
}
K_BOUNDS = {"q2_K": 0.33, "q3_K": 0.17, "q4_K": 0.08, "q5_K": 0.042, "q6_K": 0.025}


def expected_levels(x, eff, off, sub, lo, hi, sym):
    """The final pass of every K quantizer: each element's level is the
    nearest (ties to even) to x under the stored sub-block scale, in float32."""
    n = len(x)
    xs = x.reshape(n, -1, sub)
    e = eff.reshape(n, -1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = xs / e if off is None else (xs + off.reshape(n, -1, 1)) / e
    return (np.clip(np.rint(v), lo, hi) + sym).reshape(n, 256)


def k_test_data(rng, n_blocks):
    n = n_blocks * 256
    normal = rng.standard_normal(n)
    data = {
        "normal": normal,
        "weights": 0.02 * normal * np.repeat(rng.uniform(0.3, 3, n // 32), 32),  # sub-block scales vary
        "positive": np.abs(normal) + 0.5,
        "outliers": normal * np.where(rng.random(n) < 0.01, 50.0, 1.0),
        "zero runs": normal * np.repeat(rng.random(n // 16) < 0.8, 16),
    }
    return {k: v.astype(np.float32) for k, v in data.items()}


@pytest.mark.parametrize("name", list(K_FORMATS))
def test_kquant_levels_are_the_requantization_fixed_point(rng, name):
    parse, sub, lo, hi, sym, _ = K_FORMATS[name]
    for dist, x in k_test_data(rng, 2048).items():
        blocks = our_quantize(name, x)
        levels, eff, off = parse(blocks)
        assert eff.dtype == np.float32 and (off is None or off.dtype == np.float32)
        x2 = x.reshape(-1, 256)
        want = expected_levels(x2, eff, off, sub, lo, hi, sym)
        live = np.repeat(eff != 0, sub, axis=1)  # zero-scale sub-blocks keep the search's levels
        wrong = live & (levels != want)
        assert not wrong.any(), (
            f"{name} {dist}: {np.count_nonzero(wrong)} levels are not the nearest under the stored "
            f"scales; first block {np.nonzero(wrong.any(axis=1))[0][0]}; seed {SEED}")
        # Dequantizing through gguf-py must give d * sc * (level - sym) - dmin * m.
        y = quants.dequantize(blocks, qtype(name)).reshape(-1, 256)
        e = np.repeat(eff, sub, axis=1)
        mine = e * (levels - sym).astype(np.float32)
        if off is not None:
            mine = mine - np.repeat(off, sub, axis=1)
        assert np.array_equal(mine, y), f"{name} {dist}: parsed levels disagree with gguf; seed {SEED}"


def _f16(v):
    return v.astype(np.float16).astype(np.float64)


def plain_minmax_quantize(name, x):
    """The obvious quantizer for the same format, as the baseline a scale
    search must beat: sub-block scale from the extremes (the largest
    magnitude to level -top for the symmetric formats, [min(x, 0), max]
    spread over all levels otherwise), sub-scales rounded against the largest,
    nearest levels. Returns the dequantized values (float64)."""
    _, sub, lo, hi, sym, bits = K_FORMATS[name]
    x = x.reshape(-1, 256)
    xs = x.reshape(len(x), -1, sub).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if sym == 0:
            top = (1 << bits) - 1
            low = np.minimum(xs.min(axis=2), 0)
            s, m = (xs.max(axis=2) - low) / hi, -low
            d, dmin = _f16(s.max(axis=1, keepdims=True) / top), _f16(m.max(axis=1, keepdims=True) / top)
            e = d * np.nan_to_num(np.clip(np.rint(s / d), 0, top))
            o = dmin * np.nan_to_num(np.clip(np.rint(m / dmin), 0, top))
            levels = np.nan_to_num(np.clip(np.rint((xs + o[..., None]) / e[..., None]), lo, hi))
            return (e[..., None] * levels - o[..., None]).reshape(len(x), 256)
        top = 1 << (bits - 1)
        signed_max = np.take_along_axis(xs, np.abs(xs).argmax(axis=2)[..., None], axis=2)[..., 0]
        s = signed_max / -sym
        d = _f16(np.take_along_axis(s, np.abs(s).argmax(axis=1)[:, None], axis=1) / -top)
        e = d * np.nan_to_num(np.clip(np.rint(s / d), -top, top - 1))
        levels = np.nan_to_num(np.clip(np.rint(xs / e[..., None]), lo, hi))
        return (e[..., None] * levels).reshape(len(x), 256)


def best_free_scale_error(name, x):
    """Brute force per sub-block over a grid of scales (and, for formats with
    a min, offsets), each kept in float64 instead of 4-8 bit sub-scales: a
    near lower bound on the squared error of any scale choice."""
    _, sub, lo, hi, sym, _ = K_FORMATS[name]
    xs = x.reshape(-1, sub).astype(np.float64)
    best = np.full(len(xs), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        if sym == 0:
            low = np.minimum(xs.min(axis=1), 0)
            s0 = (xs.max(axis=1) - low) / hi
            for f in np.linspace(0.5, 1.2, 36):
                s = (s0 * f)[:, None]
                for g in np.linspace(-1, 1, 11):
                    m = np.maximum(-low[:, None] + g * s, 0)
                    levels = np.nan_to_num(np.clip(np.rint((xs + m) / s), lo, hi))
                    best = np.minimum(best, ((s * levels - m - xs) ** 2).sum(axis=1))
        else:
            signed_max = np.take_along_axis(xs, np.abs(xs).argmax(axis=1)[:, None], axis=1)
            for f in np.linspace(0.6, 1.4, 81):
                s = signed_max / -sym * f
                levels = np.nan_to_num(np.clip(np.rint(xs / s), lo, hi))
                best = np.minimum(best, ((s * levels - xs) ** 2).sum(axis=1))
    return best.sum()


# Largest allowed total squared error of ours over the baseline's, and over
# the free-scale brute force; about 1.05-1.1x the ratios the reference
# algorithms reach on the data below (docs/quant.md).
K_SEARCH_LIMITS = {
    "q2_K": (0.87, 1.45), "q3_K": (0.98, 1.22), "q4_K": (0.88, 1.15),
    "q5_K": (0.95, 1.30), "q6_K": (0.95, 1.28),
}


@pytest.mark.parametrize("name", list(K_FORMATS))
def test_kquant_error_bound_and_search_quality(rng, name):
    vs_plain, vs_brute = K_SEARCH_LIMITS[name]
    for dist, x in k_test_data(rng, 1024).items():
        x2 = x.reshape(-1, 256).astype(np.float64)
        y = our_dequantize(name, our_quantize(name, x)).reshape(-1, 256)
        ours = ((y - x2) ** 2).sum()
        if dist != "outliers":
            rel = np.sqrt(ours / (x2 ** 2).sum())
            assert rel < K_BOUNDS[name], f"{name} {dist}: relative RMSE {rel:.4f}; seed {SEED}"
        plain = ((plain_minmax_quantize(name, x) - x2) ** 2).sum()
        if dist == "outliers":
            # A 50x element sets its whole super-block's sub-scale grid; the
            # search still must not lose to the baseline by more than noise.
            assert ours <= 1.10 * plain, f"{name} {dist}: {ours / plain:.3f}x the baseline; seed {SEED}"
            continue
        assert ours <= vs_plain * plain, (
            f"{name} {dist}: error {ours / plain:.3f}x the plain min/max quantizer's; seed {SEED}")
        # The brute force is costly; 256 super-blocks are plenty for a total.
        sub = slice(0, 256)
        ours_sub = ((y[sub] - x2[sub]) ** 2).sum()
        brute = best_free_scale_error(name, x.reshape(-1, 256)[sub])
        assert ours_sub <= vs_brute * brute, (
            f"{name} {dist}: error {ours_sub / brute:.3f}x the free-scale brute force; seed {SEED}")
