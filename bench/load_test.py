#!/usr/bin/env python3
"""Load test of `tern serve`: N concurrent clients each stream a few
completions from the default model; reports requests/s, total output tokens/s,
time to first token and inter-token latency (median and p99) for each N, and
from the server's /metrics where its steps' time went (the forward calls; the
scheduler's batch, draw and text parts; each kind of step's count and mean).

    python3 bench/load_test.py [--build build] [--clients 1,8,32] [--parallel 8]
                               [--requests 2] [--max-tokens 32] [--url http://host:port]
                               [--serve-args "--itl-stretch 0"]

Without --url it starts `tern serve` itself on a free loopback port. Not a
test: the numbers depend on the machine and whatever else runs on it."""

import argparse
import shlex
import http.client
import json
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
    """Streams one completion; returns (ttft, [inter-token gaps], output tokens)."""
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
    ttft, last, gaps, tokens, buf = None, None, [], 0, b""
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
                if ttft is None:
                    ttft = now - t0
                else:
                    gaps.append(now - last)
                last = now
    conn.close()
    return ttft, gaps, tokens


def server_steps(host, port, api_key):
    """The scheduler's counters from /metrics: steps, forward and host seconds
    by part, and each kind of step's count and seconds."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + api_key} if api_key else {})
    text = conn.getresponse().read().decode()
    out = {}
    for key, pattern in (("steps", r"^tern_forward_steps_total (\S+)$"),
                         ("forward", r"^tern_step_forward_seconds_total (\S+)$")):
        m = re.search(pattern, text, re.M)
        out[key] = float(m.group(1)) if m else 0.0
    for part, v in re.findall(r'^tern_step_host_seconds_total{part="(\w+)"} (\S+)$', text, re.M):
        out["host_" + part] = float(v)
    for kind, v in re.findall(r'^tern_step_seconds_count{kind="(\w+)"} (\S+)$', text, re.M):
        out["n_" + kind] = float(v)
    for kind, v in re.findall(r'^tern_step_seconds_sum{kind="(\w+)"} (\S+)$', text, re.M):
        out["s_" + kind] = float(v)
    return out


def describe_steps(before, after):
    """One line: where the level's steps went (differences of server_steps)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = max(d.get("steps", 0.0), 1.0)
    parts = " / ".join(f"{1000 * d.get('host_' + p, 0.0) / steps:.2f}" for p in ("batch", "draw", "text"))
    kinds = ", ".join(f"{k} {int(d.get('n_' + k, 0))} x {1000 * d.get('s_' + k, 0.0) / max(d.get('n_' + k, 0.0), 1.0):.1f} ms"
                      for k in ("decode", "decode_and_prompt", "prompt"))
    return (f"  steps {int(d.get('steps', 0))}: forward {1000 * d.get('forward', 0.0) / steps:.2f} ms a step, "
            f"host batch / draw / text {parts} ms; {kinds}")


def run_level(host, port, n_clients, n_requests, max_tokens, api_key):
    rng = random.Random(n_clients)
    ttfts, gaps, tokens, errors = [], [], [0], []
    lock = threading.Lock()

    def client(i):
        for _ in range(n_requests):
            prompt = " ".join(rng.choice(WORDS) for _ in range(8 + i % 8))
            try:
                t, g, n = one_request(host, port, prompt, max_tokens, api_key)
            except Exception as e:  # counted and reported, the run goes on
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                if t is not None:
                    ttfts.append(t)
                gaps.extend(g)
                tokens[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = n_clients * n_requests - len(errors)
    return {"clients": n_clients, "requests": done, "errors": len(errors), "wall_s": wall,
            "req_per_s": done / wall, "out_tok_per_s": tokens[0] / wall,
            "ttft_median_ms": 1000 * statistics.median(ttfts) if ttfts else float("nan"),
            "ttft_p99_ms": 1000 * percentile(ttfts, 99),
            "itl_median_ms": 1000 * statistics.median(gaps) if gaps else float("nan"),
            "itl_p99_ms": 1000 * percentile(gaps, 99), "first_error": errors[0] if errors else ""}


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
            r = run_level(host, port, n, args.requests, args.max_tokens, args.api_key)
            after = server_steps(host, port, args.api_key)
            print(f"{r['clients']:>7} {r['requests']:>5} {r['errors']:>4} {r['req_per_s']:>7.2f} "
                  f"{r['out_tok_per_s']:>9.1f} {r['ttft_median_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f} "
                  f"{r['itl_median_ms']:>8.1f} {r['itl_p99_ms']:>8.1f}", flush=True)
            print(describe_steps(before, after), flush=True)
            if r["first_error"]:
                print("  first error:", r["first_error"])
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
