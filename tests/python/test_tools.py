"""End-to-end tests of `tern synth`, `tern quantize` and `tern info`.

They drive the built binary (TERN_BUILD/tern) and check its files with an
independent reader, the `gguf` Python package: tensor names, shapes and types
(against a Python statement of the quantization mix), metadata, the tokenizer
section, dequantized weight statistics, determinism, and the error paths
(exit status 1 and a message naming the problem).
"""
import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

BUILD = Path(os.environ.get("TERN_BUILD", Path(__file__).resolve().parents[2] / "build"))
TERN = BUILD / "tern"

# The tiny preset: llama, vocab 1024, width 256, 2 layers, 4 heads, 2 kv heads, ff 512.
TINY = dict(vocab=1024, embd=256, layers=2, heads=4, kv_heads=2, ff=512, tied=False)
TINY_PARAMS = 1705216

FILE_TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
                 "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14,
                 "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "BF16": 32}
BLOCK = {"f32": 1, "f16": 1, "bf16": 1, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32,
         "q8_0": 32, "q2_K": 256, "q3_K": 256, "q4_K": 256, "q5_K": 256, "q6_K": 256}
BASE = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q4_0": "q4_0", "Q4_1": "q4_1",
        "Q5_0": "q5_0", "Q5_1": "q5_1", "Q8_0": "q8_0", "Q2_K": "q2_K", "Q3_K_S": "q3_K",
        "Q3_K_M": "q3_K", "Q3_K_L": "q3_K", "Q4_K_S": "q4_K", "Q4_K_M": "q4_K",
        "Q5_K_S": "q5_K", "Q5_K_M": "q5_K", "Q6_K": "q6_K"}


# ---- helpers -----------------------------------------------------------------

def tern(*args, ok=True):
    """Runs tern; with ok=True a failure shows its output."""
    p = subprocess.run([str(TERN), *map(str, args)], capture_output=True, text=True, timeout=120)
    if ok:
        assert p.returncode == 0, f"tern {' '.join(map(str, args))}: rc {p.returncode}\n{p.stderr}"
    return p


def info(path):
    return json.loads(tern("info", path, "--json").stdout)


def llama_tensors(s):
    """(name, ne) in the order synth writes them."""
    kv = s["kv_heads"] * (s["embd"] // s["heads"])
    e, f = s["embd"], s["ff"]
    out = [("token_embd.weight", [e, s["vocab"]])]
    for l in range(s["layers"]):
        p = f"blk.{l}."
        out += [(p + "attn_norm.weight", [e]), (p + "attn_q.weight", [e, e]),
                (p + "attn_k.weight", [e, kv]), (p + "attn_v.weight", [e, kv]),
                (p + "attn_output.weight", [e, e]), (p + "ffn_norm.weight", [e]),
                (p + "ffn_gate.weight", [e, f]), (p + "ffn_up.weight", [e, f]),
                (p + "ffn_down.weight", [f, e])]
    out.append(("output_norm.weight", [e]))
    if not s["tied"]:
        out.append(("output.weight", [e, s["vocab"]]))
    return out


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_type(ftype, name, ne, s):
    """The quantization mix for the llama layout, restated from its rules."""
    if len(ne) < 2 or not name.endswith(".weight") or "_norm.weight" in name:
        return "f32"
    base = BASE[ftype]
    if ftype in ("F32", "F16", "BF16"):
        return base
    n = s["layers"]
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    gqa = s["heads"] // s["kv_heads"]
    t = base
    if name == "output.weight" or (s["tied"] and name == "token_embd.weight"):
        t = "q8_0" if ne[0] % BLOCK[base] else (base if base == "q8_0" else "q6_K")
    elif "attn_v.weight" in name:
        if ftype == "Q2_K":
            t = "q4_K" if gqa >= 4 else "q3_K"
        elif ftype == "Q3_K_M":
            t = "q5_K" if layer < 2 else "q4_K"
        elif ftype == "Q3_K_L":
            t = "q5_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n):
            t = "q6_K"
        elif ftype == "Q4_K_S" and layer < 4:
            t = "q5_K"
    elif "ffn_down" in name:
        if ftype == "Q2_K":
            t = "q3_K"
        elif ftype == "Q3_K_M":
            t = "q5_K" if layer < n // 16 else "q4_K"
        elif ftype == "Q3_K_L":
            t = "q5_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n):
            t = "q6_K"
        elif ftype == "Q4_K_S" and layer < n // 8:
            t = "q5_K"
    elif "attn_output.weight" in name:
        t = {"Q2_K": "q3_K", "Q3_K_M": "q4_K", "Q3_K_L": "q5_K"}.get(ftype, t)
    if ne[0] % BLOCK[t]:
        t = {"q2_K": "q4_0", "q3_K": "q4_0", "q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0"}.get(t, t)
        if ne[0] % BLOCK[t]:
            t = "f16"
    return t


def check_types(doc, ftype, shape):
    want = [(name, ne, expected_type(ftype, name, ne, shape)) for name, ne in llama_tensors(shape)]
    got = [(t["name"], t["shape"], t["type"]) for t in doc["tensors"]]
    assert got == want, f"{ftype}: " + "; ".join(
        f"{g} != {w}" for g, w in zip(got, want) if g != w)


@pytest.fixture(scope="module")
def seed():
    s = random.randrange(1, 2**31)
    print(f"weight seed {s}")  # shown by pytest when a test fails
    return s


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("tools")


@pytest.fixture(scope="module")
def tiny_f32(work, seed):
    path = work / "tiny-f32.gguf"
    tern("synth", path, "--shape", "tiny", "--type", "f32", "--seed", seed)
    return path


# ---- synth + info --------------------------------------------------------------

@pytest.mark.parametrize("ftype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_1", "Q4_K_M", "Q6_K"])
def test_synth_tiny_reports_shapes_types_and_params(work, seed, ftype):
    path = work / f"tiny-{ftype}.gguf"
    tern("synth", path, "--shape", "tiny", "--type", ftype.lower(), "--seed", seed)
    doc = info(path)
    assert doc["architecture"] == "llama"
    assert doc["name"] == "synthetic tiny"
    assert doc["parameters"] == TINY_PARAMS
    assert doc["file_type"] == {"id": FILE_TYPE_IDS[ftype], "name": ftype}
    assert doc["file_size"] == path.stat().st_size
    assert doc["hparams"]["embedding_length"] == 256
    assert doc["hparams"]["block_count"] == 2
    assert doc["hparams"]["attention.head_count_kv"] == 2
    assert doc["hparams"]["rope.dimension_count"] == 64
    assert doc["tokenizer"] == {"model": "llama", "pre": "default", "vocab_size": 1024, "merges": None,
                                "bos_token_id": 1, "eos_token_id": 2, "has_chat_template": False}
    check_types(doc, ftype, TINY)
    assert sum(t["count"] for t in doc["totals"]) == len(doc["tensors"])
    assert sum(t["bytes"] for t in doc["totals"]) == sum(t["bytes"] for t in doc["tensors"])
    assert abs(sum(t["share"] for t in doc["totals"]) - 1.0) < 1e-9


def test_info_text_and_metadata(work, seed):
    path = work / "tiny-Q4_K_M.gguf"
    if not path.exists():
        tern("synth", path, "--type", "Q4_K_M", "--seed", seed)
    text = tern("info", path, "--metadata").stdout
    for line in ("architecture:    llama", "file type:       Q4_K_M (15)", "parameters:      1.7 M",
                 "blk.1.ffn_down.weight", "tokenizer.ggml.tokens (array) = [\"<unk>\""):
        assert line in text, line
    doc = json.loads(tern("info", path, "--json", "--metadata").stdout)
    md = doc["metadata"]
    assert md["general.architecture"] == "llama"
    assert md["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert md["tokenizer.ggml.tokens"]["length"] == 1024
    assert md["tokenizer.ggml.tokens"]["head"][:3] == ["<unk>", "<s>", "</s>"]
    assert md["tokenizer.ggml.add_bos_token"] is True


def test_gguf_package_reads_synth_files(work, seed):
    for ftype in ("Q8_0", "Q4_K_M"):
        path = work / f"reader-{ftype}.gguf"
        tern("synth", path, "--type", ftype, "--seed", seed)
        r = GGUFReader(path)
        f = r.fields
        assert f["general.architecture"].contents() == "llama"
        assert f["general.file_type"].contents() == FILE_TYPE_IDS[ftype]
        assert f["general.quantization_version"].contents() == 2
        assert f["llama.block_count"].contents() == 2
        assert f["llama.context_length"].contents() == 512
        assert f["llama.rope.freq_base"].contents() == pytest.approx(10000.0)
        tokens = f["tokenizer.ggml.tokens"].contents()
        assert len(tokens) == 1024 and len(set(tokens)) == 1024
        assert tokens[3:6] == ["<0x00>", "<0x01>", "<0x02>"]
        assert f["tokenizer.ggml.token_type"].contents()[3] == 6
        got = [(t.name, [int(x) for x in t.shape], t.tensor_type.name.lower()) for t in r.tensors]
        want = [(n, ne, expected_type(ftype, n, ne, TINY).lower()) for n, ne in llama_tensors(TINY)]
        assert got == want
        for t in r.tensors:
            x = dequantize(t.data, t.tensor_type).astype(np.float64)
            if len(t.shape) == 1:  # norms: 1 + N(0, 0.02)
                assert abs(x.mean() - 1.0) < 0.01, t.name
                continue
            assert abs(x.mean()) < 2e-3, (t.name, x.mean())
            assert 0.0185 < x.std() < 0.0215, (t.name, x.std())


def test_bpe_presets_with_small_dims(work, seed):
    # A 2048-token vocabulary keeps the Python reader fast; the full-size
    # vocabularies are checked by the unit tests. Llama 3 keeps its 256 special
    # tokens at the end, Qwen2 its three.
    n_vocab = 2048
    small = ["--n-layer", 1, "--n-embd", 64, "--n-head", 2, "--n-head-kv", 1, "--n-ff", 128,
             "--n-vocab", n_vocab]
    for preset, pre, bos, eos in (("llama3-8b", "llama-bpe", 2048 - 256, 2048 - 256 + 9),
                                  ("qwen2-7b", "qwen2", 2048 - 3, 2048 - 1)):
        path = work / f"{preset}.gguf"
        tern("synth", path, "--shape", preset, "--type", "q8_0", "--seed", seed, *small)
        r = GGUFReader(path)
        f = r.fields
        tokens = f["tokenizer.ggml.tokens"].contents()
        merges = f["tokenizer.ggml.merges"].contents()
        assert f["tokenizer.ggml.model"].contents() == "gpt2"
        assert f["tokenizer.ggml.pre"].contents() == pre
        assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
        assert f["tokenizer.ggml.bos_token_id"].contents() == bos
        assert f["tokenizer.ggml.eos_token_id"].contents() == eos
        assert "tokenizer.chat_template" in f
        index = {t: i for i, t in enumerate(tokens)}
        assert tokens[bos] in ("<|begin_of_text|>", "<|endoftext|>")
        assert tokens[eos] in ("<|eot_id|>", "<|im_end|>")
        assert len(merges) == bos - 256
        for k in range(len(merges)):
            a, b = merges[k].split(" ")
            assert index[a] < 256 + k and index[b] < 256 + k and tokens[256 + k] == a + b
        names = [t.name for t in r.tensors]
        assert ("blk.0.attn_q.bias" in names) == (preset == "qwen2-7b")
        doc = info(path)
        assert doc["tokenizer"]["merges"] == len(merges)
        assert doc["architecture"] == ("qwen2" if preset == "qwen2-7b" else "llama")


def test_synth_is_deterministic_and_seeded(work, seed):
    paths = []
    for i, (s, threads) in enumerate(((seed, 1), (seed, 2), (seed + 1, 2))):
        p = work / f"det-{i}.gguf"
        tern("synth", p, "--type", "q4_k_m", "--seed", s, "--threads", threads)
        paths.append(p.read_bytes())
    assert paths[0] == paths[1]
    assert paths[0] != paths[2]
    assert len(paths[0]) == len(paths[2])


# ---- quantize ------------------------------------------------------------------

ALL_TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
             "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K"]


def test_quantize_every_type_follows_the_mix(work, tiny_f32):
    src = GGUFReader(tiny_f32)
    src_tokens = src.fields["tokenizer.ggml.tokens"].contents()
    for ftype in ALL_TYPES:
        out = work / f"quant-{ftype}.gguf"
        p = tern("quantize", tiny_f32, out, ftype, "--threads", 2)
        assert "->" in p.stdout and ftype in p.stdout
        doc = info(out)
        assert doc["file_type"]["name"] == ftype
        assert doc["parameters"] == TINY_PARAMS
        check_types(doc, ftype, TINY)
        r = GGUFReader(out)
        assert r.fields["general.quantization_version"].contents() == 2
        assert r.fields["tokenizer.ggml.tokens"].contents() == src_tokens
        assert r.fields["general.name"].contents() == "synthetic tiny"


def test_quantize_matches_synth_of_the_same_type(work, seed, tiny_f32):
    # Quantizing the f32 model and synthesizing straight to the type quantize
    # the same numbers with the same mix and metadata: the files are identical.
    for ftype in ("Q4_K_M", "Q8_0"):
        out = work / f"requant-{ftype}.gguf"
        direct = work / f"direct-{ftype}.gguf"
        tern("quantize", tiny_f32, out, ftype)
        tern("synth", direct, "--type", ftype, "--seed", seed)
        assert out.read_bytes() == direct.read_bytes(), ftype


def test_q8_0_dequantizes_close_to_the_source(work, tiny_f32):
    out = work / "close-Q8_0.gguf"
    tern("quantize", tiny_f32, out, "Q8_0")
    src = {t.name: t for t in GGUFReader(tiny_f32).tensors}
    for t in GGUFReader(out).tensors:
        x = np.asarray(src[t.name].data, dtype=np.float64).reshape(-1)
        y = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
        if t.tensor_type.name == "F32":
            assert np.array_equal(x, y), t.name
            continue
        assert t.tensor_type.name == "Q8_0"
        # Per block of 32: half a step of max|x| / 127, plus 127 times the f16 rounding of the step.
        xb, yb = x.reshape(-1, 32), y.reshape(-1, 32)
        step = np.abs(xb).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(xb - yb) <= 0.57 * step + 1e-9), t.name
        assert np.sqrt(np.mean((x - y) ** 2)) / np.std(x) < 0.01, t.name


def test_quantize_fallbacks_on_width_576(work, seed):
    shape = dict(vocab=600, embd=576, layers=2, heads=9, kv_heads=3, ff=1536, tied=True)
    src = work / "w576-f32.gguf"
    tern("synth", src, "--shape", "custom", "--n-vocab", 600, "--n-embd", 576, "--n-layer", 2,
         "--n-head", 9, "--n-head-kv", 3, "--n-ff", 1536, "--tied", "--seed", seed)
    for ftype in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q2_K", "Q3_K_M", "Q4_0"):
        out = work / f"w576-{ftype}.gguf"
        tern("quantize", src, out, ftype)
        doc = info(out)
        check_types(doc, ftype, shape)
        types = {t["name"]: t["type"] for t in doc["tensors"]}
        if ftype == "Q4_K_M":
            assert types["token_embd.weight"] == "q8_0"      # tied output, 576 % 256 != 0
            assert types["blk.0.attn_q.weight"] == "q5_0"    # q4_K -> q5_0
            assert types["blk.1.attn_v.weight"] == "q8_0"    # q6_K -> q8_0
            assert types["blk.1.ffn_down.weight"] == "q6_K"  # rows of 1536 fit
        if ftype == "Q2_K":
            assert types["blk.0.attn_q.weight"] == "q4_0"


def test_requantize_needs_the_flag(work, seed):
    q = work / "already-q4.gguf"
    tern("synth", q, "--type", "Q4_K_M", "--seed", seed)
    out = work / "requant.gguf"
    p = tern("quantize", q, out, "Q8_0", ok=False)
    assert p.returncode == 1
    assert "tern quantize: error:" in p.stderr
    assert "already quantized" in p.stderr and "--allow-requantize" in p.stderr
    assert not out.exists()
    tern("quantize", q, out, "Q8_0", "--allow-requantize")
    doc = info(out)
    check_types(doc, "Q8_0", TINY)


# ---- errors --------------------------------------------------------------------

def expect_failure(args, *phrases):
    p = tern(*args, ok=False)
    assert p.returncode == 1, (args, p.returncode, p.stderr)
    for phrase in phrases:
        assert phrase in p.stderr, (args, phrase, p.stderr)
    return p


def test_error_cases(work, seed, tiny_f32):
    missing = work / "no-such-file.gguf"
    expect_failure(["info", missing], "tern info: error:", "no-such-file.gguf")
    expect_failure(["quantize", missing, work / "x.gguf", "Q4_0"], "tern quantize: error:",
                   "no-such-file.gguf")
    expect_failure(["quantize", tiny_f32, work / "x.gguf", "Q9_9"], "unknown type 'Q9_9'", "Q4_K_M")
    assert not (work / "x.gguf").exists()
    expect_failure(["quantize", tiny_f32, tiny_f32, "Q8_0"], "is the input file")

    rng = random.Random(seed)
    garbage = work / "garbage.gguf"
    garbage.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    expect_failure(["info", garbage], "tern info: error:", "garbage.gguf")
    expect_failure(["quantize", garbage, work / "y.gguf", "Q8_0"], "tern quantize: error:")
    # A real file cut short: the reader must notice, not crash.
    truncated = work / "truncated.gguf"
    data = tiny_f32.read_bytes()
    truncated.write_bytes(data[: rng.randrange(100, len(data) - 1)])
    expect_failure(["info", truncated], "tern info: error:")

    expect_failure(["synth", work / "s.gguf", "--shape", "gpt5"], "unknown shape 'gpt5'")
    expect_failure(["synth", work / "s.gguf", "--type", "q4_k_x"], "unknown type 'q4_k_x'")
    expect_failure(["synth", work / "s.gguf", "--shape", "custom", "--n-head", 3], "n_head")
    expect_failure(["synth", work / "s.gguf", "--n-vocab", 100], "too small")
    expect_failure(["synth", work / "s.gguf", "--tokenizer", "wordpiece"], "unknown tokenizer")
    expect_failure(["synth", work / "missing-dir" / "s.gguf"], "tern synth: error:", "missing-dir")
    assert not (work / "s.gguf").exists()
