#!/usr/bin/env python3
"""Load test of `tern serve`: N concurrent clients each stream a few
completions from the default model; reports requests/s, total output tokens/s,
time to first token and inter-token latency (median and p99) for each N, the
gaps' tail, and from the server's /metrics where its steps' time went (the
forward calls; the scheduler's batch, draw and text parts; each kind of step's
count, mean and spread over the histogram's buckets). The clients are spread
over several processes, so that their own interpreter lock does not delay
their reads.

    python3 bench/load_test.py [--build build] [--clients 1,8,32] [--parallel 8]
                               [--requests 2] [--max-tokens 32] [--url http://host:port]
                               [--serve-args "--itl-stretch 0"] [--client-procs N]

Without --url it starts `tern serve` itself on a free loopback port. Not a
test: the numbers depend on the machine and whatever else runs on it."""

import argparse
import shlex
import http.client
import json
import multiprocessing
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = "river stone lamp orange quiet market winter seven garden copper violin cloud harbor pencil".split()


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def one_request(host, port, prompt, max_tokens, api_key):
    """Streams one completion; returns (ttft, [gaps between pieces of text], output tokens,
    pieces). A token that ends no text (a byte of an unfinished UTF-8 character, text held
    back by a stop string) sends no piece, so its gap spans two steps."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft, last, gaps, tokens, pieces, buf = None, None, [], 0, 0, b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.decode()[len("data: "):]
            if data == "[DONE]":
                continue
            j = json.loads(data)
            if "error" in j:
                raise RuntimeError(j["error"]["message"])
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
            if j["choices"] and j["choices"][0]["text"]:
                now = time.perf_counter()
                pieces += 1
                if ttft is None:
                    ttft = now - t0
                else:
                    gaps.append(now - last)
                last = now
    conn.close()
    return ttft, gaps, tokens, pieces


def server_steps(host, port, api_key):
    """The scheduler's counters from /metrics: steps, forward seconds (and
    the part spent issuing), graphs captured, host seconds by part, and each
    kind of step's count and seconds."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + api_key} if api_key else {})
    text = conn.getresponse().read().decode()
    out = {}
    for key, pattern in (("steps", r"^tern_forward_steps_total (\S+)$"),
                         ("forward", r"^tern_step_forward_seconds_total (\S+)$"),
                         ("issue", r"^tern_step_forward_issue_seconds_total (\S+)$"),
                         ("graphs", r"^tern_graphs_captured_total (\S+)$")):
        m = re.search(pattern, text, re.M)
        out[key] = float(m.group(1)) if m else 0.0
    for part, v in re.findall(r'^tern_step_host_seconds_total{part="(\w+)"} (\S+)$', text, re.M):
        out["host_" + part] = float(v)
    for kind, v in re.findall(r'^tern_step_seconds_count{kind="(\w+)"} (\S+)$', text, re.M):
        out["n_" + kind] = float(v)
    for kind, v in re.findall(r'^tern_step_seconds_sum{kind="(\w+)"} (\S+)$', text, re.M):
        out["s_" + kind] = float(v)
    for kind, le, v in re.findall(r'^tern_step_seconds_bucket{kind="(\w+)",le="([^"]+)"} (\S+)$', text, re.M):
        out[f"b|{kind}|{le}"] = float(v)  # cumulative
    return out


def describe_steps(before, after):
    """One line: where the level's steps went (differences of server_steps)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = max(d.get("steps", 0.0), 1.0)
    parts = " / ".join(f"{1000 * d.get('host_' + p, 0.0) / steps:.2f}" for p in ("batch", "draw", "text"))
    kinds = ", ".join(f"{k} {int(d.get('n_' + k, 0))} x {1000 * d.get('s_' + k, 0.0) / max(d.get('n_' + k, 0.0), 1.0):.1f} ms"
                      for k in ("decode", "decode_and_prompt", "prompt"))
    line = (f"  steps {int(d.get('steps', 0))}: forward {1000 * d.get('forward', 0.0) / steps:.2f} ms a step "
            f"(issuing {1000 * d.get('issue', 0.0) / steps:.2f}), "
            f"host batch / draw / text {parts} ms; {kinds}; graphs captured {int(d.get('graphs', 0))}")
    for k in ("decode", "decode_and_prompt"):
        # upper bound (s, "+Inf" read as inf) -> steps at or below it
        cumulative_at = {float(key.split("|")[2]): v for key, v in d.items() if key.startswith(f"b|{k}|")}
        counts, below, last = [], 0.0, 0.0
        for b, cumulative in sorted(cumulative_at.items()):
            if cumulative > below:
                label = f"<={1000 * b:g}" if b != float("inf") else f">{1000 * last:g}"
                counts.append(f"{label} {int(cumulative - below)}")
            below, last = cumulative, b
        if counts:
            line += f"\n    {k} steps by time (ms): " + ", ".join(counts)
    return line


def client_group(host, port, clients, n_requests, max_tokens, api_key, barrier, results):
    """One process's clients, each on a thread of its own, started together
    with every other process's; puts what they measured on `results`."""
    ttfts, gaps, tokens, pieces, errors = [], [], [0], [0], []
    lock = threading.Lock()

    def client(i):
        rng = random.Random(i)
        for _ in range(n_requests):
            prompt = " ".join(rng.choice(WORDS) for _ in range(8 + i % 8))
            try:
                t, g, n, k = one_request(host, port, prompt, max_tokens, api_key)
            except Exception as e:  # counted and reported, the run goes on
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                if t is not None:
                    ttfts.append(t)
                gaps.extend(g)
                tokens[0] += n
                pieces[0] += k

    threads = [threading.Thread(target=client, args=(i,)) for i in clients]
    barrier.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put({"ttfts": ttfts, "gaps": gaps, "tokens": tokens[0], "pieces": pieces[0], "errors": errors})


def run_level(host, port, n_clients, n_requests, max_tokens, api_key, n_procs):
    """n_clients streaming clients spread over n_procs processes: the clients
    of one process share its interpreter lock, and a thread waiting for it
    reads its stream late, which shows as gaps between tokens that the server
    never made."""
    n_procs = max(1, min(n_procs, n_clients))
    barrier = multiprocessing.Barrier(n_procs + 1)
    results = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=client_group,
                                     args=(host, port, list(range(p, n_clients, n_procs)), n_requests, max_tokens,
                                           api_key, barrier, results))
             for p in range(n_procs)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    parts = [results.get() for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    ttfts = [t for r in parts for t in r["ttfts"]]
    gaps = [g for r in parts for g in r["gaps"]]
    errors = [e for r in parts for e in r["errors"]]
    tokens = sum(r["tokens"] for r in parts)
    pieces = sum(r["pieces"] for r in parts)
    done = n_clients * n_requests - len(errors)
    return {"clients": n_clients, "requests": done, "errors": len(errors), "wall_s": wall,
            "req_per_s": done / wall, "out_tok_per_s": tokens / wall,
            "ttft_median_ms": 1000 * statistics.median(ttfts) if ttfts else float("nan"),
            "ttft_p99_ms": 1000 * percentile(ttfts, 99),
            "itl_median_ms": 1000 * statistics.median(gaps) if gaps else float("nan"),
            "itl_p99_ms": 1000 * percentile(gaps, 99), "gaps": gaps, "tokens": tokens, "pieces": pieces,
            "first_error": errors[0] if errors else ""}


def describe_gaps(r):
    """One line: the inter-token gaps' tail and how many tokens each piece of text carried."""
    gaps = r["gaps"]
    if not gaps:
        return "  gaps: none"
    med = statistics.median(gaps)
    over = sum(1 for g in gaps if g > 2 * med)
    tail = " / ".join(f"{1000 * percentile(gaps, p):.1f}" for p in (90, 95, 99, 99.9))
    return (f"  gaps {len(gaps)}: p90 / p95 / p99 / p99.9 {tail} ms, max {1000 * max(gaps):.1f}; "
            f"{100 * over / len(gaps):.2f}% above twice the median; "
            f"{r['tokens'] / max(r['pieces'], 1):.3f} tokens a piece of text")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--url", help="use a running server instead of starting one")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--client-procs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="processes the clients are spread over (default: half the cores)")
    ap.add_argument("--serve-args", default="", help="more arguments for the server it starts, e.g. \"--itl-stretch 0\"")
    args = ap.parse_args()

    proc = None
    if args.url:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname, u.port or 80
    else:
        cmd = [str(Path(args.build) / "tern"), "serve", "-m", args.model, "--port", "0", "--parallel",
               str(args.parallel), "--ctx", "512", "--threads", str(args.threads), "--max-queue", "256"] + shlex.split(args.serve_args)
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        host, port = "127.0.0.1", None
        said = []  # what the server printed, shown if it does not start
        for line in proc.stderr:
            said.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
            if "model loaded" in line:
                break
        if port is None:
            sys.exit("tern serve did not start:\n" + "".join(said[-10:]))
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()

    try:
        print(f"{'clients':>7} {'reqs':>5} {'err':>4} {'req/s':>7} {'out tok/s':>9} {'TTFT med':>9} "
              f"{'TTFT p99':>9} {'ITL med':>8} {'ITL p99':>8}  (ms)")
        for n in [int(x) for x in args.clients.split(",")]:
            before = server_steps(host, port, args.api_key)
            r = run_level(host, port, n, args.requests, args.max_tokens, args.api_key, args.client_procs)
            after = server_steps(host, port, args.api_key)
            print(f"{r['clients']:>7} {r['requests']:>5} {r['errors']:>4} {r['req_per_s']:>7.2f} "
                  f"{r['out_tok_per_s']:>9.1f} {r['ttft_median_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f} "
                  f"{r['itl_median_ms']:>8.1f} {r['itl_p99_ms']:>8.1f}", flush=True)
            print(describe_steps(before, after), flush=True)
            print(describe_gaps(r), flush=True)
            if r["first_error"]:
                print("  first error:", r["first_error"])
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
