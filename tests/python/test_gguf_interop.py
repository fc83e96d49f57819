"""GGUF interop with the reference Python implementation (PyPI `gguf`).

Files written by tern's Writer must load in gguf.GGUFReader with the same
metadata and tensors, and files written by gguf.GGUFWriter (single and split)
must read back through tern's reader with the values that were written. tern's
side is seen through tests/probes/gguf_probe, which dumps what the reader sees
as JSON (strings and data as hex, floats as bit patterns, so comparisons are
exact). Values are random each run; the seed is printed on failure.
"""
import json
import os
import random
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGUFValueType as VT

NAMES = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"]
SCALAR_FMT = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
              VT.INT32: "<i", VT.UINT64: "<Q", VT.INT64: "<q"}


def probe():
    build = os.environ.get("TERN_BUILD")
    assert build, "TERN_BUILD must name the build directory"
    path = Path(build) / "probes" / "gguf_probe"
    assert path.exists(), f"{path} is missing: build the gguf_probe target"
    return str(path)


def dump(path):
    r = subprocess.run([probe(), "dump", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"tern reader failed on {path}: {r.stderr}"
    return json.loads(r.stdout)


# --- one normal form for values: (type name, payload) -------------------------
# Scalars: int / bool; f32 and f64: their bit patterns; strings: bytes;
# arrays: ("array", elem type name, [items]).

def from_dump(v):
    t = v["type"]
    if t == "array":
        return ("array", v["elem_type"], [from_dump(x) for x in v["value"]])
    if t == "string":
        return ("string", bytes.fromhex(v["value"]))
    return (t, v["value"])


def from_reader_parts(parts, i, vtype):
    """Rebuilds a value from GGUFReader's flat parts, walking them in file order."""
    vtype = VT(int(vtype))
    if vtype == VT.STRING:
        return ("string", bytes(parts[i + 1])), i + 2
    if vtype == VT.ARRAY:
        itype = int(parts[i][0])
        n = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            item, i = from_reader_parts(parts, i, itype)
            items.append(item)
        return ("array", NAMES[itype], items), i
    x = parts[i]
    if vtype == VT.FLOAT32:
        return ("f32", int(x.view(np.uint32)[0])), i + 1
    if vtype == VT.FLOAT64:
        return ("f64", int(x.view(np.uint64)[0])), i + 1
    if vtype == VT.BOOL:
        return ("bool", bool(x[0])), i + 1
    return (NAMES[int(vtype)], int(x[0])), i + 1


def reader_value(field):
    # A key-value field's parts: key length, key bytes, value type, value parts.
    value, end = from_reader_parts(field.parts, 3, field.types[0])
    assert end == len(field.parts)
    return value


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f64_bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def expected_form(vtype, value, sub=None):
    """Normal form of a value handed to GGUFWriter.add_key_value."""
    if vtype == VT.STRING:
        return ("string", value.encode("utf-8"))
    if vtype == VT.FLOAT32:
        return ("f32", f32_bits(value))
    if vtype == VT.FLOAT64:
        return ("f64", f64_bits(value))
    if vtype == VT.BOOL:
        return ("bool", bool(value))
    if vtype == VT.ARRAY:
        if sub is None:
            sub = gguf.GGUFValueType.get_type(value[0])
        return ("array", NAMES[int(sub)], [expected_form(sub, x) for x in value])
    return (NAMES[int(vtype)], int(value))


# --- tern writes, gguf.GGUFReader reads ----------------------------------------

@pytest.mark.parametrize("run", range(3))
def test_tern_writer_loads_in_gguf_reader(tmp_path, run):
    seed = random.SystemRandom().randrange(2**63)
    print("seed", seed)
    path = tmp_path / "tern.gguf"
    r = subprocess.run([probe(), "write", str(path), str(seed)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ours = dump(path)
    reader = gguf.GGUFReader(path)

    assert ours["version"] == 3
    assert int(reader.fields["GGUF.version"].parts[0][0]) == 3
    assert reader.alignment == ours["alignment"]
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert keys == [kv["key"] for kv in ours["metadata"]]
    for kv in ours["metadata"]:
        assert reader_value(reader.fields[kv["key"]]) == from_dump(kv["v"]), (seed, kv["key"])
    assert reader.fields["general.architecture"].contents() == "tern-test"
    assert reader.fields["t.strings"].contents() == [
        bytes.fromhex(x["value"]).decode() for x in next(
            kv for kv in ours["metadata"] if kv["key"] == "t.strings")["v"]["value"]]

    assert [t.name for t in reader.tensors] == [t["name"] for t in ours["tensors"]]
    for rt, ot in zip(reader.tensors, ours["tensors"]):
        assert int(rt.tensor_type) == ot["type"], rt.name
        assert [int(x) for x in rt.shape] == ot["ne"], rt.name
        assert int(rt.n_bytes) == ot["n_bytes"], rt.name
        assert int(rt.data_offset) == reader.data_offset + ot["offset"], rt.name
        assert np.asarray(rt.data).tobytes() == bytes.fromhex(ot["data"]), (seed, rt.name)
    assert {int(t.tensor_type) for t in reader.tensors} == {0, 1, 8}


# --- gguf.GGUFWriter writes, tern reads ----------------------------------------

def random_metadata(rng):
    """(key, type, value, sub_type) covering every value type GGUFWriter can write."""
    words = ["".join(rng.choice("abcdefgh\u00e9\u4e2d ") for _ in range(rng.randrange(0, 12)))
             for _ in range(rng.randrange(1, 30))]
    return [
        ("t.u8", VT.UINT8, rng.randrange(256), None),
        ("t.i8", VT.INT8, rng.randrange(-128, 128), None),
        ("t.u16", VT.UINT16, rng.randrange(2**16), None),
        ("t.i16", VT.INT16, rng.randrange(-2**15, 2**15), None),
        ("t.u32", VT.UINT32, rng.randrange(2**32), None),
        ("t.i32", VT.INT32, rng.randrange(-2**31, 2**31), None),
        ("t.u64", VT.UINT64, rng.randrange(2**64), None),
        ("t.i64", VT.INT64, rng.randrange(-2**63, 2**63), None),
        ("t.f32", VT.FLOAT32, float(np.float32(rng.uniform(-1e6, 1e6))), None),
        ("t.f64", VT.FLOAT64, rng.uniform(-1e300, 1e300), None),
        ("t.bool", VT.BOOL, rng.random() < 0.5, None),
        ("t.string", VT.STRING, "caf\u00e9 \u4e2d\u6587 " + str(rng.random()), None),
        ("t.strings", VT.ARRAY, words, None),
        ("t.i32s", VT.ARRAY, [rng.randrange(-2**31, 2**31) for _ in range(rng.randrange(1, 50))], None),
        ("t.f32s", VT.ARRAY, [float(np.float32(rng.uniform(-10, 10))) for _ in range(rng.randrange(1, 50))], None),
        ("t.u64s", VT.ARRAY, [rng.randrange(2**64) for _ in range(5)], VT.UINT64),
        ("t.u8s", VT.ARRAY, [rng.randrange(256) for _ in range(7)], VT.UINT8),
        ("t.f64s", VT.ARRAY, [rng.uniform(-1, 1) for _ in range(3)], VT.FLOAT64),
        ("t.bools", VT.ARRAY, [True, False, True], None),
        ("t.nested", VT.ARRAY, [[1, 2, 3], [rng.randrange(100)]], None),
        ("t.nested_strings", VT.ARRAY, [["a", "bc"], ["d"]], None),
    ]


def write_reference_file(path, rng, split_max_tensors=0):
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    meta = random_metadata(rng)
    for key, vtype, value, sub in meta:
        w.add_key_value(key, value, vtype, sub_type=sub)
    a = np.array([rng.uniform(-1, 1) for _ in range(6 * 4)], dtype=np.float32).reshape(6, 4)
    b = np.array([rng.uniform(-1, 1) for _ in range(16)], dtype=np.float16)
    c32 = np.array([rng.uniform(-3, 3) for _ in range(3 * 64)], dtype=np.float32).reshape(3, 64)
    c = gguf.quants.quantize(c32, gguf.GGMLQuantizationType.Q8_0)
    d = np.array([rng.uniform(-1, 1) for _ in range(2 * 3 * 5)], dtype=np.float32).reshape(2, 3, 5)
    w.add_tensor("blk.0.a", a)
    w.add_tensor("blk.0.b", b)
    w.add_tensor("blk.0.c", c, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.1.d", d)
    tensors = [("blk.0.a", 0, [4, 6], a), ("blk.0.b", 1, [16], b), ("blk.0.c", 8, [64, 3], c),
               ("blk.1.d", 0, [5, 3, 2], d)]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return meta, tensors


def check_tern_sees(ours, meta, tensors, seed):
    got = {kv["key"]: from_dump(kv["v"]) for kv in ours["metadata"]}
    assert got["general.architecture"] == ("string", b"llama")
    for key, vtype, value, sub in meta:
        assert got[key] == expected_form(vtype, value, sub), (seed, key)
    by_name = {t["name"]: t for t in ours["tensors"]}
    assert sorted(by_name) == sorted(t[0] for t in tensors)
    for name, type_id, ne, array in tensors:
        t = by_name[name]
        assert t["type"] == type_id, name
        assert t["ne"] == ne, name
        assert t["n_bytes"] == array.nbytes, name
        assert bytes.fromhex(t["data"]) == array.tobytes(), (seed, name)


@pytest.mark.parametrize("run", range(3))
def test_gguf_writer_file_reads_in_tern(tmp_path, run):
    seed = random.SystemRandom().randrange(2**63)
    print("seed", seed)
    rng = random.Random(seed)
    path = tmp_path / "ref.gguf"
    meta, tensors = write_reference_file(path, rng)
    ours = dump(path)
    assert ours["version"] == 3
    check_tern_sees(ours, meta, tensors, seed)
    # The reference reader agrees value for value.
    reader = gguf.GGUFReader(path)
    for kv in ours["metadata"]:
        assert reader_value(reader.fields[kv["key"]]) == from_dump(kv["v"]), kv["key"]


def test_gguf_writer_split_files_read_as_one(tmp_path):
    seed = random.SystemRandom().randrange(2**63)
    print("seed", seed)
    rng = random.Random(seed)
    meta, tensors = write_reference_file(tmp_path / "model.gguf", rng, split_max_tensors=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"model-{i:05d}-of-00004.gguf" for i in range(1, 5)]
    ours = dump(tmp_path / "model-00001-of-00004.gguf")
    check_tern_sees(ours, meta, tensors, seed)
    assert [t["name"] for t in ours["tensors"]] == [t[0] for t in tensors]
    got = {kv["key"]: from_dump(kv["v"]) for kv in ours["metadata"]}
    assert got["split.count"] == ("u16", 4)
    assert got["split.no"] == ("u16", 0)
    # A missing split is an error naming it, not a partial model.
    (tmp_path / "model-00003-of-00004.gguf").unlink()
    r = subprocess.run([probe(), "dump", str(tmp_path / "model-00001-of-00004.gguf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "model-00003-of-00004.gguf: cannot open" in r.stderr


def test_truncated_reference_files_are_errors(tmp_path):
    seed = random.SystemRandom().randrange(2**63)
    print("seed", seed)
    rng = random.Random(seed)
    path = tmp_path / "ref.gguf"
    _, tensors = write_reference_file(path, rng)
    data = path.read_bytes()
    # Where the last tensor's data ends; GGUFWriter pads after it.
    reader = gguf.GGUFReader(path)
    end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    cut_points = sorted({0, 3, 4, 8, 23, end - 1} | {rng.randrange(end) for _ in range(40)})
    for n in cut_points:
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(data[:n])
        r = subprocess.run([probe(), "dump", str(cut)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (seed, n, r.stdout[:200], r.stderr)
        assert r.stderr.startswith(str(cut) + ": "), r.stderr
        assert "truncated" in r.stderr or "extends past end of file" in r.stderr or \
            "cannot fit" in r.stderr or "exceeds" in r.stderr, r.stderr
