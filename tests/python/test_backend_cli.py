"""End-to-end tests of choosing the compute backend: `--backend auto|cpu|cuda`
and `--gpu N` on every command that opens a model (run, chat, perplexity,
bench, serve). A backend that cannot be had (cuda without a CUDA build or a
GPU) and a name tern does not know end with exit status 1 and a message
saying why; cpu and the default (auto) run; bench reports the backend and the
GPU memory it holds. Runs on a tiny synthetic model, so it is quick."""

import csv as csv_module
import io
import json
import os
import pty
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("TERN_SOURCE", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("TERN_BUILD", SOURCE / "build"))
TERN = BUILD / "tern"
TIMEOUT = 120

SEED = random.SystemRandom().randrange(1 << 32)
RNG = random.Random(SEED)

def _has_serve():
    # `serve` exists only in builds with the HTTP server (-DTERN_SERVER=ON).
    r = subprocess.run([str(TERN), "--help"], capture_output=True, text=True, timeout=TIMEOUT)
    return re.search(r"^ +serve ", r.stdout, re.M) is not None


MODEL_COMMANDS = ["run", "chat", "perplexity", "bench"] + (["serve"] if _has_serve() else [])
WORDS = ["river", "stone", "light", "window", "garden", "winter", "paper", "music", "orange", "bridge"]


@pytest.fixture(autouse=True)
def _print_seed():
    print(f"test_backend_cli random seed: {SEED}")


def tern(*args, stdin="", timeout=TIMEOUT, **kw):
    if not TERN.exists():
        pytest.fail(f"{TERN} not found: build tern first")
    return subprocess.run([str(TERN), *map(str, args)], input=stdin, capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("backend") / "tiny.gguf"
    r = tern("synth", path, "--shape", "tiny", "--type", "q8_0", "--seed", RNG.randrange(1 << 31))
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("backend-text") / "words.txt"
    path.write_text(" ".join(RNG.choice(WORDS) for _ in range(400)))
    return path


def cuda_usable():
    """(built with CUDA, GPUs listed) as `tern --version` reports them."""
    r = tern("--version")
    assert r.returncode == 0, r.stderr
    built = ", CUDA (" in r.stdout
    assert built or "built without CUDA" in r.stdout, r.stdout
    return built, built and re.search(r"^gpu \d+: ", r.stdout, re.M) is not None


def auto_choice():
    built, gpus = cuda_usable()
    return "CUDA" if built and gpus else "CPU"


def command_args(cmd, model, text_file):
    """The arguments that make `cmd` open the model (and little else)."""
    common = ["-m", model, "-t", "1"]
    return {
        "run": ["run", *common, "-p", "hello", "-n", 2],
        "chat": ["chat", *common, "-n", 2],
        "perplexity": ["perplexity", *common, "-f", text_file, "-c", 32, "--chunks", 1],
        "bench": ["bench", "-m", model, "-t", 1, "-p", 4, "-n", 1, "-r", 1],
        "serve": ["serve", *common, "--port", 0],
    }[cmd]


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_help_lists_backend_and_gpu(cmd):
    r = tern(cmd, "--help")
    assert r.returncode == 0, r.stderr
    assert re.search(r"--backend NAME +Compute backend: auto .*cpu or cuda \(default auto\)", r.stdout), r.stdout
    assert re.search(r"--gpu INT +GPU device index", r.stdout), r.stdout


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_cuda_without_cuda_fails_naming_why(cmd, model, text_file):
    built, gpus = cuda_usable()
    if built and gpus:
        pytest.skip("this build has CUDA and sees a GPU: --backend cuda can run here")
    r = tern(*command_args(cmd, model, text_file), "--backend", "cuda")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"tern {cmd}: error:" in r.stderr and "backend cuda:" in r.stderr, r.stderr
    if not built:
        assert "this build of tern has no CUDA backend" in r.stderr and "-DTERN_CUDA=ON" in r.stderr, r.stderr
    else:
        assert "GPU" in r.stderr, r.stderr
    assert "terminate" not in r.stderr and "Segmentation" not in r.stderr
    assert r.stdout.strip() == "", r.stdout


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_unknown_backend_names_the_accepted_ones(cmd, model, text_file):
    name = RNG.choice(["bogus", "gpu", "CUDA0", "metal", "vulkan"])
    r = tern(*command_args(cmd, model, text_file), "--backend", name)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"tern {cmd}: error: --backend: unknown backend '{name}' (choose auto, cpu or cuda)" in r.stderr, r.stderr


@pytest.mark.parametrize("cmd, value, needle", [
    ("run", "-1", "--gpu must be 0 or more (got -1)"),
    ("bench", "-3", "--gpu must be 0 or more (got -3)"),
    ("perplexity", "-2", "--gpu must be 0 or more (got -2)"),
    ("chat", "one", "--gpu: 'one' is not an integer"),
] + ([("serve", "-2", "--gpu must be 0 or more (got -2)")] if "serve" in MODEL_COMMANDS else []))
def test_bad_gpu_index(cmd, value, needle, model, text_file):
    r = tern(*command_args(cmd, model, text_file), "--gpu", value)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"tern {cmd}: error:" in r.stderr and needle in r.stderr, r.stderr


def test_cpu_and_default_run_and_say_which_backend(model):
    prompt = " ".join(RNG.choice(WORDS) for _ in range(RNG.randint(2, 6)))
    args = ["run", "-m", model, "-t", 1, "-p", prompt, "-n", 6, "--temp", 0, "-v"]
    cpu = tern(*args, "--backend", "cpu")
    assert cpu.returncode == 0, cpu.stderr
    assert re.search(r"^model: .*, backend CPU \((scalar|avx2|avx512) kernels\)$", cpu.stderr, re.M), cpu.stderr
    assert re.search(r"eval time =\s+[\d.]+ ms /\s+6 tokens", cpu.stderr), cpu.stderr
    default = tern(*args)
    assert default.returncode == 0, default.stderr
    chosen = auto_choice()
    assert re.search(rf"^model: .*, backend {chosen}\b", default.stderr, re.M), default.stderr
    if chosen == "CPU":
        # Same backend, greedy: the same text.
        assert default.stdout == cpu.stdout
    # --gpu is only read by the cuda backend.
    cpu_gpu = tern(*args, "--backend", "cpu", "--gpu", 7)
    assert cpu_gpu.returncode == 0, cpu_gpu.stderr
    assert cpu_gpu.stdout == cpu.stdout


def test_simd_cap_from_the_environment_keeps_the_text(model):
    # TERN_CPU_SIMD caps the CPU kernels' path; every path gives the same
    # bits, so greedy text is the same on each.
    prompt = " ".join(RNG.choice(WORDS) for _ in range(RNG.randint(2, 6)))
    args = ["run", "-m", model, "-t", 1, "-p", prompt, "-n", 8, "--temp", 0, "-v", "--backend", "cpu"]

    def run_with(value):
        env = dict(os.environ)
        env.pop("TERN_CPU_SIMD", None)
        if value is not None:
            env["TERN_CPU_SIMD"] = value
        r = tern(*args, env=env)
        assert r.returncode == 0, r.stderr
        path = re.search(r"backend CPU \((\w+) kernels\)", r.stderr)
        assert path, r.stderr
        return r, path.group(1)

    best, best_path = run_with(None)
    scalar, scalar_path = run_with("scalar")
    assert scalar_path == "scalar" and scalar.stdout == best.stdout
    capped, capped_path = run_with("avx2")
    assert capped_path == ("scalar" if best_path == "scalar" else "avx2") and capped.stdout == best.stdout
    unknown, unknown_path = run_with("sse9")
    assert "TERN_CPU_SIMD=sse9 is not one of scalar, avx2, avx512; ignored" in unknown.stderr, unknown.stderr
    assert unknown_path == best_path and unknown.stdout == best.stdout


def test_cpu_backend_draws_no_load_progress_on_a_terminal(model):
    # Weights of the CPU backend are the file's memory map: nothing to show,
    # even where a bar would be drawn (stderr a terminal).
    master, slave = pty.openpty()
    try:
        r = subprocess.run([str(TERN), "run", "-m", str(model), "-t", "1", "-p", "hello", "-n", "2",
                            "--backend", "cpu"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=slave, timeout=TIMEOUT)
        os.close(slave)
        slave = -1
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            err += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    text = err.decode(errors="replace")
    assert r.returncode == 0, text
    assert "eval time" in text, text  # the terminal did get the stderr output
    assert "loading model" not in text, text


def test_bench_reports_backend_and_gpu_memory(model):
    r = tern("bench", "-m", model, "-t", 1, "-p", 8, "-n", 2, "-r", 1, "-o", "json", "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["test"] for row in rows] == ["pp8", "tg2"]
    for row in rows:
        keys = list(row)
        assert keys.index("gpu_mem_mib") == keys.index("backend") + 1
        assert row["backend"] == "CPU" and row["gpu_mem_mib"] == 0

    csv = tern("bench", "-m", model, "-t", 1, "-p", 8, "-n", 0, "-r", 1, "-o", "csv", "--backend", "cpu")
    assert csv.returncode == 0, csv.stderr
    (row,) = list(csv_module.DictReader(io.StringIO(csv.stdout)))
    assert row["backend"] == "CPU" and float(row["gpu_mem_mib"]) == 0

    md = tern("bench", "-m", model, "-t", 1, "-p", 8, "-n", 0, "-r", 1)
    assert md.returncode == 0, md.stderr
    head, _, first = md.stdout.splitlines()[:3]
    cells = [c.strip() for c in first.strip("|").split("|")]
    names = [c.strip() for c in head.strip("|").split("|")]
    assert names[3:5] == ["backend", "gpu mem"], head
    chosen = auto_choice()
    assert cells[3] == chosen, first
    if chosen == "CPU":
        assert cells[4] == "", first
    else:
        assert re.fullmatch(r"[\d.]+ MiB", cells[4]) and float(cells[4].split()[0]) > 0, first


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_help_lists_tp(cmd):
    r = tern(cmd, "--help")
    assert r.returncode == 0, r.stderr
    assert re.search(r"--tp INT +Tensor parallelism", r.stdout), r.stdout


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_cpu_ranks_run_every_command(cmd, model, text_file):
    # The tiny model has 2 KV heads: two CPU ranks take one each.
    args = [*command_args(cmd, model, text_file), "--backend", "cpu", "--tp", 2]
    if cmd == "serve":
        # Runs until stopped: wait for the model to load on both ranks, then stop it.
        p = subprocess.Popen([str(TERN), *map(str, args)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            for line in p.stderr:
                lines.append(line)
                if "model loaded" in line or "error" in line:
                    break
            assert any("model loaded on CPU" in l and "tensor parallel over 2 ranks" in l for l in lines), lines
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=TIMEOUT)
        assert p.returncode == 0, p.returncode
        return
    r = tern(*args, "-v")
    assert r.returncode == 0, r.stderr
    assert re.search(r"backend CPU \(\w+ kernels\), tensor parallel over 2 ranks", r.stderr), r.stderr


@pytest.mark.parametrize("value, needle", [
    ("0", "--tp must be between 1 and 64 (got 0)"),
    ("65", "--tp must be between 1 and 64 (got 65)"),
    ("3", "n_head_kv = 2 KV heads cannot be divided evenly over 3 ranks"),
    ("two", "--tp: 'two' is not an integer"),
])
def test_bad_tp_names_the_problem(value, needle, model, text_file):
    cmd = RNG.choice([c for c in MODEL_COMMANDS if c != "serve"])
    r = tern(*command_args(cmd, model, text_file), "--backend", "cpu", "--tp", value)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"tern {cmd}: error:" in r.stderr and needle in r.stderr, r.stderr
    assert r.stdout.strip() == "", r.stdout


def test_gpu_ranks_without_gpus_say_which_gpus(model, text_file):
    built, gpus = cuda_usable()
    if built and gpus:
        pytest.skip("this build has CUDA and sees a GPU: --backend cuda --tp can run here")
    r = tern(*command_args("run", model, text_file), "--backend", "cuda", "--tp", 2)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "tern run: error:" in r.stderr, r.stderr
    if built:
        assert "backend cuda:" in r.stderr and "(--tp 2 uses GPUs 0 to 1)" in r.stderr, r.stderr
    else:
        assert "--tp 2: this build of tern has no CUDA backend" in r.stderr, r.stderr
    assert r.stdout.strip() == "", r.stdout


def test_bench_reports_tp(model):
    r = tern("bench", "-m", model, "-t", 2, "-p", 8, "-n", 2, "-r", 1, "-o", "json", "--backend", "cpu", "--tp", 2)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["test"] for row in rows] == ["pp8", "tg2"]
    for row in rows:
        assert row["backend"] == "CPU tp=2" and row["tp"] == 2 and row["gpu_mem_mib"] == 0, row
        assert row["avg_ts"] > 0, row


def test_bench_json_on_the_default_backend(model):
    r = tern("bench", "-m", model, "-t", 1, "-p", 4, "-n", 0, "-r", 1, "-o", "json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["backend"] == auto_choice()
    if row["backend"] == "CPU":
        assert row["gpu_mem_mib"] == 0
    else:
        # At least the weights live on the device.
        assert row["gpu_mem_mib"] * (1 << 20) >= row["model_size"]
