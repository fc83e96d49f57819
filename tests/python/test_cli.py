"""End-to-end tests of `tern run`, `tern chat`, `tern perplexity` and
`tern bench` on the default model: what a user sees (streamed text, timing
lines, a finite perplexity, a parseable benchmark) and that mistakes end with
one clear error line and exit status 1. Kept short (a few tokens per run) so
the whole file takes well under a minute on two cores."""

import csv as csv_module
import io
import json
import math
import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("TERN_SOURCE", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("TERN_BUILD", SOURCE / "build"))
TERN = BUILD / "tern"
MODEL = Path(os.environ.get("TERN_MODEL", SOURCE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
TIMEOUT = 120  # seconds per command: a hang fails instead of blocking the suite

# Every test draws its random inputs from this seed; it is printed on failure.
SEED = random.SystemRandom().randrange(1 << 32)
RNG = random.Random(SEED)


@pytest.fixture(autouse=True)
def _print_seed():
    # Captured output is shown only for failing tests.
    print(f"test_cli random seed: {SEED}")


def require_setup():
    if not TERN.exists():
        pytest.fail(f"{TERN} not found: build tern first (scripts/setup or cmake --build)")
    if not MODEL.exists():
        pytest.fail(f"model {MODEL} not found: run scripts/setup to download it (or set TERN_MODEL)")


def tern(*args, stdin=None, timeout=TIMEOUT):
    require_setup()
    return subprocess.run([str(TERN), *map(str, args)], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def tern_model(cmd, *args, **kw):
    # One thread: on a shared two-core machine a second thread that has to
    # wait for a busy core makes every step slower, not faster.
    return tern(cmd, "-m", MODEL, "-t", "1", *args, **kw)


TIMING = re.compile(r"(prompt eval time|       eval time) =\s+([\d.]+) ms /\s+(\d+) tokens "
                    r"\(\s*([\d.]+) ms per token,\s+([\d.]+) tokens per second\)")


def timings(stderr):
    """{'prompt': (ms, tokens, tok/s), 'eval': (...)} for each timing block, in order."""
    out = []
    for m in TIMING.finditer(stderr):
        key = "prompt" if m.group(1).startswith("prompt") else "eval"
        out.append((key, float(m.group(2)), int(m.group(3)), float(m.group(5))))
    return out


PROMPTS = ["The capital of France is", "Once upon a time, there was a", "The three primary colors are",
           "To make a cup of tea, first", "The largest planet in the solar system is"]


def test_run_greedy_streams_text_and_timings():
    prompt = RNG.choice(PROMPTS)
    r = tern_model("run", "-p", prompt, "-n", 12, "--temp", 0)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip(), f"no text generated for {prompt!r}"
    t = timings(r.stderr)
    assert [k for k, *_ in t] == ["prompt", "eval"], r.stderr
    (_, p_ms, p_n, p_tps), (_, g_ms, g_n, g_tps) = t
    assert p_n >= 4 and p_ms > 0 and p_tps > 0
    assert 1 <= g_n <= 12 and g_ms > 0 and g_tps > 0
    assert "total time" in r.stderr


def test_run_temperature_zero_is_deterministic():
    prompt = RNG.choice(PROMPTS)
    # Greedy ignores the seed: two different seeds give the same text.
    a = tern_model("run", "-p", prompt, "-n", 10, "--temp", 0, "--seed", RNG.randrange(1 << 30))
    b = tern_model("run", "-p", prompt, "-n", 10, "--temp", 0, "--seed", RNG.randrange(1 << 30))
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and a.stdout.strip()


def test_run_same_seed_same_text():
    prompt = RNG.choice(PROMPTS)
    seed = RNG.randrange(1 << 40)
    flags = ["-p", prompt, "-n", 8, "--temp", 1.5, "--top-k", 0, "--top-p", 1, "--min-p", 0, "-v"]
    a = tern_model("run", *flags, "--seed", seed)
    b = tern_model("run", *flags, "--seed", seed)
    c = tern_model("run", *flags, "--seed", seed + 1)
    assert a.returncode == 0 and b.returncode == 0 and c.returncode == 0, a.stderr + c.stderr
    assert a.stdout == b.stdout and a.stdout.strip()
    assert f"seed: {seed}" in a.stderr
    # At temperature 1.5 over the whole vocabulary, 8 tokens from another
    # seed coincide with negligible probability.
    assert c.stdout != a.stdout


def test_run_random_seed_is_printed_and_reproduces():
    prompt = RNG.choice(PROMPTS)
    flags = ["-p", prompt, "-n", 8, "--temp", 1.2, "-v"]
    a = tern_model("run", *flags)
    assert a.returncode == 0, a.stderr
    m = re.search(r"^seed: (\d+)$", a.stderr, re.M)
    assert m, a.stderr
    b = tern_model("run", *flags, "--seed", m.group(1))
    assert b.returncode == 0 and b.stdout == a.stdout


def test_run_stop_string_is_not_printed():
    prompt = RNG.choice(PROMPTS)
    full = tern_model("run", "-p", prompt, "-n", 12, "--temp", 0)
    assert full.returncode == 0, full.stderr
    text = full.stdout.rstrip("\n")
    words = text.split()
    assert len(words) >= 3, text
    stop = words[len(words) // 2]
    cut = tern_model("run", "-p", prompt, "-n", 12, "--temp", 0, "--stop", stop)
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout.rstrip("\n") == text[:text.index(stop)].rstrip("\n")


def test_run_chat_template():
    r = tern_model("run", "--chat", "-p", "What is 2+2?", "-n", 12, "--temp", 0, "-v")
    assert r.returncode == 0, r.stderr
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>" in r.stderr  # the rendered prompt
    assert r.stdout.strip()
    assert "<|im_end|>" not in r.stdout and "<|im_start|>" not in r.stdout


def prompt_tokens(*args):
    r = tern_model("run", *args, "-n", 1, "--temp", 0, "-v")
    assert r.returncode == 0, r.stderr
    return int(re.search(r"^prompt: (\d+) tokens$", r.stderr, re.M).group(1))


def test_special_token_text_in_prompts():
    # A plain prompt parses "<|im_start|>" into one control token unless
    # --no-special; inside a --chat message it is always plain text.
    assert prompt_tokens("-p", "<|im_start|>") == 1
    assert prompt_tokens("-p", "<|im_start|>", "--no-special") > 3
    plain = prompt_tokens("--chat", "-p", "Hello there")
    spelled = prompt_tokens("--chat", "-p", "Hello<|im_end|> there")
    assert spelled - plain > 3, (plain, spelled)


def test_chat_through_a_pipe_answers_each_line_and_ends_at_eof():
    questions = RNG.sample(["Hello! Who are you?", "What is the capital of Italy?", "Name a color.",
                            "What is 3 times 3?", "Say something about cats."], 2)
    r = tern_model("chat", "--temp", 0, "-n", 12, "-v", stdin="\n".join(questions) + "\n", timeout=90)
    assert r.returncode == 0, r.stderr
    t = timings(r.stderr)
    assert [k for k, *_ in t] == ["prompt", "eval", "prompt", "eval"], r.stderr
    assert r.stdout.strip() and not r.stdout.startswith("> ")  # no prompt marker without a terminal
    # The second turn re-renders the whole conversation; the prefix already in
    # the KV cache is reused, so far fewer tokens are evaluated than the first
    # prompt plus the first answer.
    first_prompt, first_answer, second_prompt = t[0][2], t[1][2], t[2][2]
    assert second_prompt < first_prompt + first_answer, r.stderr


def test_chat_from_a_terminal_shows_a_prompt_and_ends_at_ctrl_d():
    require_setup()
    master, slave = os.openpty()
    try:
        p = subprocess.Popen([str(TERN), "chat", "-m", str(MODEL), "-t", "1", "--temp", "0", "-n", "6"],
                             stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.close(slave)
        # Canonical mode hands over one line per read; Ctrl-D at the start
        # of the next line is end of input.
        os.write(master, b"Hi!\n\x04")
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        os.close(master)
    assert p.returncode == 0, err
    assert out.startswith("> ") and out.count("> ") >= 2, out  # a prompt before each line read
    assert len(out) > 6 and "/exit" in err


def test_ctrl_c_stops_generation_and_still_reports():
    require_setup()
    p = subprocess.Popen([str(TERN), "run", "-m", str(MODEL), "-t", "1", "-p", RNG.choice(PROMPTS), "-n", "-1",
                          "--ignore-eos", "--temp", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.read(1), "no text streamed"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=TIMEOUT)
    err = err.decode()
    assert p.returncode == 0, err
    t = timings(err)
    assert [k for k, *_ in t] == ["prompt", "eval"], err
    assert t[1][2] < 1000, "generation went on after SIGINT"


def test_chat_reset_and_exit_commands():
    r = tern_model("chat", "--temp", 0, "-n", 6, "-v", stdin="Hi!\n/reset\nHello.\n/exit\nNever read.\n")
    assert r.returncode == 0, r.stderr
    assert "history cleared" in r.stderr
    assert len([k for k, *_ in timings(r.stderr) if k == "eval"]) == 2


def test_chat_drops_old_turns_when_the_context_fills():
    # About 20 tokens of default system prompt, 16 per question and up to 14
    # per answer: the third turn no longer fits 96 positions less 12 reserved.
    lines = "\n".join(f"Tell me fact number {i} about the sea." for i in range(3)) + "\n"
    r = tern_model("chat", "--temp", 0, "-n", 12, "-c", 96, "-v", stdin=lines, timeout=90)
    assert r.returncode == 0, r.stderr
    assert len([k for k, *_ in timings(r.stderr) if k == "eval"]) == 3, r.stderr
    assert "dropped the" in r.stderr and "oldest turn" in r.stderr


WORDS = ("the river carried small boats past the old mill while children watched from the bridge and "
         "their parents talked about the harvest the weather and the price of bread in the market town "
         "where every morning the baker opened his shop before sunrise").split()


def sample_text(n_words):
    sentences, words = [], 0
    while words < n_words:
        k = RNG.randint(6, 14)
        s = " ".join(RNG.choice(WORDS) for _ in range(k))
        sentences.append(s[0].upper() + s[1:] + ".")
        words += k
    return " ".join(sentences)


def test_perplexity_prints_chunks_and_a_finite_estimate(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(sample_text(260))
    r = tern_model("perplexity", "-f", text, "--ctx", 64, "--chunks", 2)
    assert r.returncode == 0, r.stderr
    chunks = re.findall(r"^\[(\d+)\] ([\d.]+)$", r.stdout, re.M)
    assert [int(c) for c, _ in chunks] == [1, 2], r.stdout
    m = re.search(r"PPL = ([\d.]+) \+/- ([\d.]+)", r.stdout)
    assert m, r.stdout
    ppl, err = float(m.group(1)), float(m.group(2))
    assert math.isfinite(ppl) and 1.0 < ppl < 49152, ppl  # better than uniform over the vocabulary
    assert math.isfinite(err) and 0 < err < ppl
    assert float(chunks[-1][1]) == pytest.approx(ppl, rel=1e-3)  # the last running value is the estimate


def test_perplexity_is_low_on_repeated_text(tmp_path):
    # A sentence repeated over and over is easy to continue once seen: the
    # scored second half of each chunk is nearly certain. Scoring the wrong
    # position (an off-by-one) or the wrong chunk half would lose that.
    sentence = sample_text(12).split(".")[0] + ". "
    repeated, salad = tmp_path / "repeated.txt", tmp_path / "salad.txt"
    repeated.write_text(sentence * 40)
    salad.write_text(sample_text(260))
    values = []
    for path in (repeated, salad):
        r = tern_model("perplexity", "-f", path, "--ctx", 64, "--chunks", 2)
        assert r.returncode == 0, r.stderr
        values.append(float(re.search(r"PPL = ([\d.]+)", r.stdout).group(1)))
    assert values[0] < 2.0, values
    assert values[1] > 3 * values[0], values


def test_perplexity_text_too_short(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text(sample_text(20))
    r = tern_model("perplexity", "-f", text, "--ctx", 64)
    assert r.returncode == 1
    assert "tern perplexity: error:" in r.stderr and "needs at least 128" in r.stderr, r.stderr


def test_bench_json_rows():
    # The CPU pinned: on a machine with a GPU, auto would pick CUDA.
    r = tern_model("bench", "--backend", "cpu", "-p", 16, "-n", 4, "-r", 2, "-o", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["test"] for row in rows] == ["pp16", "tg4"]
    for row in rows:
        assert row["n_threads"] == 1 and row["backend"] == "CPU" and row["gpu_mem_mib"] == 0
        assert row["model_type"] == "llama 135M Q4_1"
        assert 100e6 < row["model_n_params"] < 200e6
        assert 0 < row["model_size"] < MODEL.stat().st_size
        assert len(row["samples_ts"]) == 2 and len(row["samples_ns"]) == 2
        assert all(ts > 0 for ts in row["samples_ts"])
        n = row["n_prompt"] + row["n_gen"]
        for ts, ns in zip(row["samples_ts"], row["samples_ns"]):
            assert ts == pytest.approx(n * 1e9 / ns, rel=1e-6)
        assert row["avg_ts"] == pytest.approx(sum(row["samples_ts"]) / 2, rel=1e-6)
        assert row["peak_rss_bytes"] > 10 << 20
    assert rows[0]["n_prompt"] == 16 and rows[1]["n_gen"] == 4


def test_bench_markdown_and_csv():
    md = tern_model("bench", "--backend", "cpu", "-p", 8, "-n", 0, "-r", 1)
    assert md.returncode == 0, md.stderr
    lines = md.stdout.splitlines()
    assert re.match(r"\| model +\| +size \| +params \| backend +\| +gpu mem \| threads \| +test \| +t/s \|",
                    lines[0]), lines[0]
    # The GPU memory cell is empty on the CPU.
    assert re.match(r"\| llama 135M Q4_1 +\| +[\d.]+ MiB \| +1[0-9]{2}\.\d\d M \| CPU +\| +\| +1 \| +pp8 \| "
                    r"+[\d.]+ ± [\d.]+ \|", lines[2]), lines[2]
    assert re.search(r"^build: tern \S+, peak RSS [\d.]+ [MG]iB$", md.stdout, re.M), md.stdout
    # Comma lists: every combination of threads and tests is a row.
    out = tern("bench", "-m", MODEL, "-t", "1,2", "-p", 8, "-n", 2, "-r", 1, "-o", "csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv_module.DictReader(io.StringIO(out.stdout)))
    assert list(rows[0])[:3] == ["build", "model_filename", "model_type"]
    got = [(row["n_threads"], row["test"]) for row in rows]
    assert got == [("1", "pp8"), ("1", "tg2"), ("2", "pp8"), ("2", "tg2")], out.stdout
    for row in rows:
        assert len(row["samples_ts"].split()) == 1 and float(row["avg_ts"]) > 0


def test_bench_depth_and_bandwidth():
    r = tern_model("bench", "--backend", "cpu", "-p", 8, "-n", 3, "-d", "0,16", "-r", 1, "-o", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(row["test"], row["n_depth"]) for row in rows] == [("pp8", 0), ("tg3", 0), ("pp8 @ d16", 16),
                                                                ("tg3 @ d16", 16)]
    for row in rows:
        # The default model's embedding table is also its output head: every byte is read per token.
        assert row["weight_bytes"] == row["model_size"]
        assert row["copy_gbps"] > 0
        if row["n_gen"] == 0:
            assert row["weight_gbps"] is None and row["copy_share"] is None
            continue
        assert row["weight_gbps"] == pytest.approx(row["weight_bytes"] * row["avg_ts"] / 1e9, rel=1e-6)
        assert row["copy_share"] == pytest.approx(row["weight_gbps"] / row["copy_gbps"], rel=1e-6)
    md = tern_model("bench", "--backend", "cpu", "-p", 0, "-n", 2, "-d", 8, "-r", 1)
    assert md.returncode == 0, md.stderr
    lines = md.stdout.splitlines()
    assert lines[0].rstrip().endswith("| weights GB/s | of copy |"), lines[0]
    assert re.search(r"\| +tg2 @ d8 \| +[\d.]+ ± [\d.]+ \| +[\d.]+ \| +\d+% \|$", lines[2]), lines[2]


def test_bench_batched_rows():
    r = tern_model("bench", "--backend", "cpu", "--batched", "--npp", "8,12", "--ntg", 3, "--npl", "1,3",
                   "-o", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(row["pp"], row["tg"], row["pl"]) for row in rows] == [(8, 3, 1), (8, 3, 3), (12, 3, 1), (12, 3, 3)]
    for row in rows:
        assert row["backend"] == "CPU" and row["gpu_mem_mib"] == 0 and row["n_threads"] == 1
        assert row["n_kv"] == row["pl"] * (row["pp"] + row["tg"])
        assert row["t_pp"] > 0 and row["t_tg"] > 0
        assert row["speed_pp"] == pytest.approx(row["pl"] * row["pp"] / row["t_pp"], rel=1e-6)
        assert row["speed_tg"] == pytest.approx(row["pl"] * row["tg"] / row["t_tg"], rel=1e-6)
        assert row["t"] == pytest.approx(row["t_pp"] + row["t_tg"], rel=1e-9)
        assert row["speed"] == pytest.approx(row["n_kv"] / row["t"], rel=1e-6)
    md = tern_model("bench", "--backend", "cpu", "--batched", "--npp", 8, "--ntg", 2, "--npl", 2)
    assert md.returncode == 0, md.stderr
    lines = [line for line in md.stdout.splitlines() if line.startswith("|")]
    assert re.match(r"\| +PP \| +TG \| +B \| +N_KV \| +T_PP s \| +S_PP t/s \| +T_TG s \| +S_TG t/s \| +T s \| "
                    r"+S t/s \| +gpu mem \|", lines[0]), lines[0]
    assert re.match(r"\| +8 \| +2 \| +2 \| +20 \| +[\d.]+ \| +[\d.]+ \|", lines[2]), lines[2]


@pytest.mark.parametrize("args, needle", [
    (["--batched", "-p", 8], "-p is not a --batched option"),
    (["--batched", "-d", 64], "-d is not a --batched option"),
    (["--npl", 4], "--npl needs --batched"),
    (["--batched", "--npl", "0"], "--npl: 0 is below 1"),
    (["--batched", "-t", "1,2"], "--batched takes one thread count"),
])
def test_bench_batched_mistakes(args, needle):
    r = tern("bench", "-m", MODEL, "--backend", "cpu", *args)
    assert r.returncode == 1, (args, r.stdout)
    assert "tern bench: error:" in r.stderr and needle in r.stderr, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["run", "-m", "/nonexistent/model.gguf", "-p", "hi"], "model file not found: /nonexistent/model.gguf"),
    (["run", "-p", "hi", "--temp", "-1"], "--temp"),
    (["run", "-p", "hi", "--top-p", "2"], "--top-p"),
    (["run", "-p", "hi", "--temp", "warm"], "--temp: 'warm' is not a finite number"),
    (["run", "-p", "hi", "--bogus-flag"], "unknown option '--bogus-flag'"),
    (["run", "-p", "hi", "-n", "-5"], "-n must be"),
    (["run"], "no prompt"),
    (["chat", "--top-k", "-3"], "--top-k"),
    (["perplexity"], "no text"),
    (["bench", "-p", "16,x"], "-p: 'x' is not an integer"),
    (["bench", "-o", "xml"], "unknown format 'xml'"),
    (["serve", "--itl-stretch", "0.5"], "--itl-stretch must be 0 (no cap) or above 1"),
    (["serve", "--itl-stretch", "nan"], "--itl-stretch: 'nan' is not a finite number"),
])
def test_errors_exit_1_with_a_message(args, needle):
    r = tern(*args)
    assert r.returncode == 1, (args, r.returncode, r.stderr)
    cmd = args[0]
    assert f"tern {cmd}: error:" in r.stderr and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "terminate" not in r.stderr


def test_prompt_longer_than_the_context():
    r = tern_model("run", "-c", 16, "-p", " ".join(RNG.choice(WORDS) for _ in range(40)))
    assert r.returncode == 1
    assert "tern run: error:" in r.stderr and "does not fit" in r.stderr, r.stderr


def test_truncate_keeps_the_newest_prompt_tokens():
    prompt = " ".join(RNG.choice(WORDS) for _ in range(40))
    r = tern_model("run", "-c", 16, "-p", prompt, "-n", 4, "--temp", 0, "--truncate", "-v")
    assert r.returncode == 0, r.stderr
    # Half the context is kept for the prompt, so 4 tokens are generated.
    assert re.search(r"eval time =\s+[0-9.]+ ms /\s+4 tokens", r.stderr), r.stderr
