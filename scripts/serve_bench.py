#!/usr/bin/env python3
"""A load generator for any OpenAI-compatible server (npullm_server, llama-server, ...).

C concurrent clients, each streaming chat completions one after another over a fixed workload:
prompts of about --words words that differ per request (a shared --system prompt of about
--system-words words may lead every one), --tokens generated tokens each with ignore_eos.
Prints requests/s, generated tokens/s, TTFT and inter-token latency p50 / p99, and errors.

  scripts/serve_bench.py --url http://127.0.0.1:8080 -c 1 4 8 16 --requests 32 --tokens 64
  scripts/serve_bench.py -c 8 --duration 600 --rss-pid $(pgrep npullm_server)   # a 10-minute soak

Only Python's standard library (http.client, threads). A request counts as failed on any
status but 200, a stream without `data: [DONE]`, or fewer tokens than asked for (counted from
the stream's chunks, which may carry more than one token: the usage chunk's completion_tokens
is used where the server sends it).
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse

WORDS = ("time person year way day thing man world life hand part child eye woman place work "
         "week case point government company number group problem fact river mountain city "
         "table window garden music market science history language story question answer").split()


def prompt_text(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def one_request(url, key, body):
    """Streams one chat completion; returns (ok, ttft, [inter-token gaps], tokens, error)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    start = time.perf_counter()
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        res = conn.getresponse()
        if res.status != 200:
            return False, None, [], 0, "status %d" % res.status
        first = None
        last = None
        gaps = []
        chunks = 0
        usage = None
        done = False
        for raw in res:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                if c.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    if first is None:
                        first = now - start
                    else:
                        gaps.append(now - last)
                    last = now
                    chunks += 1
        tokens = usage["completion_tokens"] if usage else chunks
        if not done:
            return False, first, gaps, tokens, "no [DONE]"
        if tokens < body["max_tokens"]:
            return False, first, gaps, tokens, "%d of %d tokens" % (tokens, body["max_tokens"])
        return True, first, gaps, tokens, None
    except Exception as e:  # a dropped connection is a failure, counted
        return False, None, [], 0, type(e).__name__
    finally:
        conn.close()


def run(args, concurrency):
    lock = threading.Lock()
    todo = list(range(args.requests))
    results = []
    served = [0]
    deadline = time.perf_counter() + args.duration if args.duration else None
    system = prompt_text(random.Random(7), args.system_words) if args.system_words else None

    def client():
        while True:
            with lock:
                if deadline is not None:  # --duration: requests until the time is up
                    if time.perf_counter() >= deadline:
                        return
                    i = served[0]
                    served[0] += 1
                elif not todo:
                    return
                else:
                    i = todo.pop()
            # Prompts differ per request and per level (a later level must not find the
            # earlier level's prompts in a prefix cache); the same between runs and servers.
            rng = random.Random(1000003 * concurrency + i)
            messages = []
            if system:
                messages.append({"role": "system", "content": system})
            messages.append({"role": "user", "content": prompt_text(rng, args.words)})
            body = {"model": args.model, "messages": messages, "max_tokens": args.tokens,
                    "temperature": 0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}, "cache_prompt": not args.no_cache}
            r = one_request(args.url, args.api_key, body)
            with lock:
                results.append(r)

    rss = []  # (seconds, resident KiB) of --rss-pid, every 5 s
    stop = threading.Event()

    def sample():
        while True:
            try:
                with open("/proc/%d/status" % args.rss_pid) as f:
                    kb = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
                rss.append((time.perf_counter() - t0, kb))
            except (OSError, StopIteration):
                pass
            if stop.wait(5):
                return

    t0 = time.perf_counter()
    sampler = threading.Thread(target=sample) if args.rss_pid else None
    if sampler:
        sampler.start()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stop.set()
    if sampler:
        sampler.join()
    ok = [r for r in results if r[0]]
    ttft = [r[1] for r in ok if r[1] is not None]
    gaps = [g for r in ok for g in r[2]]
    tokens = sum(r[3] for r in ok)
    errors = {}
    for r in results:
        if not r[0]:
            errors[r[4]] = errors.get(r[4], 0) + 1
    return {
        "concurrency": concurrency, "requests": len(results), "ok": len(ok), "wall_s": wall,
        "requests_per_s": len(ok) / wall, "tokens_per_s": tokens / wall,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_ms": 1e3 * percentile(gaps, 50), "itl_p99_ms": 1e3 * percentile(gaps, 99),
        "errors": errors, "rss_kib": rss,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--api-key", default="")
    p.add_argument("--model", default="model")
    p.add_argument("-c", "--concurrency", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--words", type=int, default=200, help="words of each user prompt")
    p.add_argument("--system-words", type=int, default=0, help="a shared system prompt's words")
    p.add_argument("--tokens", type=int, default=64, help="generated tokens per request")
    p.add_argument("--no-cache", action="store_true", help="cache_prompt: false")
    p.add_argument("--duration", type=float, default=0,
                   help="seconds per level: requests until the time is up (a soak), not --requests")
    p.add_argument("--rss-pid", type=int, default=0,
                   help="the server's process id: its resident memory sampled every 5 s and "
                        "its growth printed (after the first tenth of the run, when warm, to the end)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = []
    print("| C | requests ok | req/s | gen tokens/s | TTFT p50 / p99 (s) | ITL p50 / p99 (ms) | errors |")
    print("|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        r = run(args, c)
        rows.append(r)
        print("| %d | %d / %d | %.2f | %.1f | %.2f / %.2f | %.0f / %.0f | %s |" % (
            c, r["ok"], r["requests"], r["requests_per_s"], r["tokens_per_s"], r["ttft_p50_s"],
            r["ttft_p99_s"], r["itl_p50_ms"], r["itl_p99_ms"], r["errors"] or 0), flush=True)
        if r["rss_kib"]:
            warm = [kb for t, kb in r["rss_kib"] if t >= r["wall_s"] / 10] or [r["rss_kib"][-1][1]]
            print("resident memory: %.1f MiB warm, %.1f MiB at the end, %.1f MiB peak: %+.2f %%" % (
                warm[0] / 1024, warm[-1] / 1024, max(kb for _, kb in r["rss_kib"]) / 1024,
                100.0 * (warm[-1] - warm[0]) / warm[0]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
