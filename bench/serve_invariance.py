#!/usr/bin/env python3
"""Batch invariance through `tern serve`: greedy completions of a few probe
prompts, each sent alone, then again while N other requests run at once (for
each N given). Every probe's text must be the same in every setting; the
script prints a line per setting and exits 1 when any probe differs.

  bench/serve_invariance.py --model MODEL.gguf [--build build] [--levels 8,32,64,128]
                            [--parallel 128] [--max-tokens 64] [--backend auto]
"""
import argparse
import http.client
import json
import random
import re
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = "river stone lamp orange quiet market winter seven garden copper violin cloud harbor pencil".split()


def complete(port, prompt, max_tokens):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": prompt, "max_tokens": max_tokens,
                                                             "temperature": 0}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {body}")
    return body["choices"][0]["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--levels", default="8,32,64,128", help="concurrent requests around the probes")
    ap.add_argument("--parallel", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--probes", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    text = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 40)))
    probes = [text() for _ in range(args.probes)]

    cmd = [str(Path(args.build) / "tern"), "serve", "-m", args.model, "--port", "0", "--backend", args.backend,
           "--parallel", str(args.parallel), "--ctx", str(args.ctx), "--max-queue", "1024"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "model loaded" in line:
            print(line.strip(), flush=True)
            break
    if port is None:
        sys.exit("tern serve did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    failed = False
    try:
        alone = [complete(port, p, args.max_tokens) for p in probes]
        print(f"alone: {len(alone)} probes, {sum(len(a) for a in alone)} characters", flush=True)
        for level in [int(x) for x in args.levels.split(",")]:
            # The probes and level - probes others, all sent at once, the probes spread among them.
            prompts = [text() for _ in range(max(level, args.probes))]
            at = sorted(rng.sample(range(len(prompts)), args.probes))
            for i, p in zip(at, probes):
                prompts[i] = p
            results = [None] * len(prompts)

            def worker(i):
                try:
                    results[i] = complete(port, prompts[i], args.max_tokens)
                except Exception as e:  # reported as a difference below
                    results[i] = repr(e)

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            same = sum(results[i] == a for i, a in zip(at, alone))
            failed |= same != args.probes
            print(f"among {len(prompts):4}: {same} of {args.probes} probes identical to their solo runs", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
