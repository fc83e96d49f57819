"""Regenerates the GGUF fuzz seeds in tests/fuzz/seeds/gguf/ (small valid files).

    python3 tests/fuzz/make_seeds.py [path/to/gguf_probe]

Seeds come from three writers so the fuzzer starts from every layout we know:
hand-packed bytes (version 2 and 3, odd alignments, nested arrays), the PyPI
`gguf` GGUFWriter (single and split), and tern's own Writer through the probe.
"""
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf

OUT = Path(__file__).resolve().parent / "seeds" / "gguf"


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def hand_made(version, alignment, nested_depth):
    kvs = [
        s("general.architecture") + struct.pack("<I", 8) + s("llama"),
        s("general.alignment") + struct.pack("<II", 4, alignment),
        s("t.ints") + struct.pack("<IIQ", 9, 5, 3) + struct.pack("<iii", 1, -2, 3),
        s("t.flag") + struct.pack("<IB", 7, 1),
        s("t.f64") + struct.pack("<Id", 12, 0.5),
        s("t.words") + struct.pack("<IIQ", 9, 9, 2) + struct.pack("<IQ", 8, 2) + s("a") + s("bc")
        + struct.pack("<IQ", 8, 0),
    ]
    deep = struct.pack("<I", 9)
    for _ in range(nested_depth - 1):
        deep += struct.pack("<IQ", 9, 1)
    deep += struct.pack("<IQB", 0, 1, 42)
    kvs.append(s("t.deep") + deep)
    infos = [
        s("w") + struct.pack("<IQQIQ", 2, 8, 2, 0, 0),      # f32 [8, 2] at 0
        s("q") + struct.pack("<IQIQ", 1, 32, 8, 64 if alignment <= 64 else alignment),  # q8_0 [32]
    ]
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % alignment)
    q_offset = 64 if alignment <= 64 else alignment
    data = bytes((k * 7 + 1) & 255 for k in range(64)) + b"\0" * (q_offset - 64)
    data += bytes((k * 3) & 255 for k in range(34))
    return head + data


def gguf_writer_file(path, split=False):
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=1 if split else 0)
    w.add_uint32("llama.context_length", 128)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("t.bool", True)
    w.add_key_value("t.u64", 2**40 + 3, gguf.GGUFValueType.UINT64)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b\u00e9"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.0, -3.0])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("a", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.add_tensor("b", np.arange(4, dtype=np.float16))
    q = gguf.quants.quantize(np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 32),
                             gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("c", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "hand_v3.gguf").write_bytes(hand_made(3, 32, 3))
    (OUT / "hand_v2_align8.gguf").write_bytes(hand_made(2, 8, 2))
    (OUT / "hand_align128_deep.gguf").write_bytes(hand_made(3, 128, 12))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        gguf_writer_file(tmp / "py.gguf")
        shutil.copy(tmp / "py.gguf", OUT / "pywriter.gguf")
        gguf_writer_file(tmp / "sp.gguf", split=True)
        shutil.copy(tmp / "sp-00001-of-00003.gguf", OUT / "pywriter_split_part1.gguf")
        if len(sys.argv) > 1:
            subprocess.run([sys.argv[1], "write", str(tmp / "tern.gguf"), "1"], check=True)
            shutil.copy(tmp / "tern.gguf", OUT / "tern_writer.gguf")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{len(list(OUT.iterdir()))} seeds, {total} bytes")
    assert total < 20000


if __name__ == "__main__":
    main()
