"""Compares tern's tokenizer on the test model with an independent one.

The oracle is Hugging Face `tokenizers`, with a BPE model built from the
GGUF file's own tokens and merges and SmolLM2's pre-tokenizer (Digits with
individual digits, then ByteLevel without a prefix space); control tokens are
registered as special tokens. Inputs are fresh random strings each run (the
seed is printed on failure) drawn from many scripts, emoji, whitespace kinds,
digits and special-token texts, encoded with and without special parsing.
"""
import os
import random
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("TERN_SOURCE", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("TERN_BUILD", SOURCE / "build"))
MODEL = Path(os.environ.get("TERN_MODEL", SOURCE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
PROBE = BUILD / "probes" / "text_tokenize"


def build_oracle():
    try:
        import gguf
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError as e:
        pytest.fail(f"the oracle needs the Python packages gguf and tokenizers ({e}); pip install gguf tokenizers")
    if not MODEL.exists():
        pytest.fail(f"test model not found at {MODEL}: run scripts/setup (or set TERN_MODEL)")
    reader = gguf.GGUFReader(str(MODEL))

    def field(key):
        f = reader.fields[key]
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [int(f.parts[i][0]) for i in f.data]

    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = field("tokenizer.ggml.merges")
    pre = bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    assert pre == "smollm", f"this oracle reproduces the smollm pre-tokenizer, the model has {pre}"
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    return tk


PALETTE = [
    "the", " the", "Hello", " World", "don't", "I'M", " we'll", "ü", "ß", "Straße", "é", "ñ",
    "中文", "日本語", "カタカナ", "한국어", "Ελληνικά", "Русский", "العربية", "हिन्दी", "ไทย", "עברית",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪", "❤️", "🏳️‍🌈", " ", "  ", "    ", "\t", "\n", "\n\n", "\r\n",
    "\u00a0", "\u3000", "\u2009", "\u200b", "\u2028", "\u0085", "0", "12", "2024", "3.14", "٣", "½", "²",
    "!", "?!", "...", "--", "(", ")", "{}", "#", "$", "'", '"', "`", "<|im_start|>", "<|im_end|>",
    "<|endoftext|>", "<", "|", ">", "<|", "\x04", "\x1d", "e\u0301", "\ufeff",
]

# Code point ranges for random characters (no surrogates, none in the planes
# whose UTF-8 lead bytes this vocabulary lacks).
RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
          (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x23FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF),
          (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF)]


def random_text(rng):
    parts = []
    for _ in range(rng.randint(0, 24)):
        if rng.random() < 0.7:
            parts.append(rng.choice(PALETTE))
        else:
            lo, hi = rng.choice(RANGES)
            parts.append(chr(rng.randint(lo, hi)))
    return "".join(parts)


def run_probe(lines):
    if not PROBE.exists():
        pytest.fail(f"probe {PROBE} not built (ninja -C {BUILD} text_tokenize)")
    out = subprocess.run([str(PROBE), str(MODEL)], input="".join(lines), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.split("\n")[:-1]
    assert len(rows) == len(lines)
    result = []
    for row in rows:
        ids, hexed = row.split("\t")
        result.append(([int(x) for x in ids.split()] if ids else [], bytes.fromhex(hexed)))
    return result


def test_random_strings_match_oracle():
    tk = build_oracle()
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    texts = [random_text(rng) for _ in range(1500)]
    lines = []
    for t in texts:
        h = t.encode("utf-8").hex()
        lines += [f"p {h}\n", f"t {h}\n"]
    got = run_probe(lines)
    mismatches = []
    for i, t in enumerate(texts):
        tk.encode_special_tokens = False
        want_p = tk.encode(t, add_special_tokens=False).ids
        tk.encode_special_tokens = True
        want_t = tk.encode(t, add_special_tokens=False).ids
        (ids_p, dec_p), (ids_t, dec_t) = got[2 * i], got[2 * i + 1]
        if ids_p != want_p or ids_t != want_t:
            mismatches.append((t, ids_p, want_p, ids_t, want_t))
        # Decoding gives back the text, minus the bytes this vocabulary cannot encode.
        expected_text = tk.decode(want_p, skip_special_tokens=False).encode("utf-8")
        assert dec_p == expected_text, f"seed {seed}: decode of {t!r}"
        assert dec_t == tk.decode(want_t, skip_special_tokens=False).encode("utf-8"), f"seed {seed}: {t!r}"
    assert not mismatches, f"seed {seed}: {len(mismatches)} of {len(texts)} differ, first: {mismatches[0]!r}"
