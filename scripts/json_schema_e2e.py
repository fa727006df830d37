#!/usr/bin/python3
"""JSON Schema constrained generation end to end: npullm_run -j on MaskBench's schemas.

    scripts/json_schema_e2e.py --run build/release/examples/npullm_run --model FILE.gguf \
        [--every 50] [--limit 40] [-n 512] [-t 2] [--seed 1] [-l ID+BIAS ...] [DIR]

For every --every-th file of DIR (default ../shared/vectors/maskbench, the files sorted by
name) whose schema npullm compiles, runs `npullm_run -m MODEL -p PROMPT -j SCHEMA -n N --temp
1 --seed S -t T` and checks the text it generates: it must parse as JSON (json.loads) and
validate against the schema (python3-jsonschema, the Debian package, an independent
validator: the schema's own draft). A generation that reaches -n before the grammar lets it
end is counted as cut (its text is a prefix of a valid value, not a value); a schema npullm
refuses to compile (a keyword it cannot honour) is counted as refused. Also prints the
sampler's share of the decode time that npullm_run reports (with -j: the grammar's masks).

The model may have random weights (../shared/peer's files): the grammar alone must make the
output valid, which is what this checks. Such a model rarely ends a string by itself (a quote
is a few of the ~150k tokens a string allows), so -l (npullm_run's logit bias, repeatable)
can raise the closing tokens (Qwen2's '"' 1, '",' 497, '"}' 9207, '"]' 1341): the grammar
still decides which tokens are allowed. Exit status 1 if any generated text is invalid.
"""
import argparse
import json
import os
import re
import subprocess
import sys

try:
    import jsonschema
except ImportError:  # pragma: no cover
    sys.exit("json_schema_e2e: python3-jsonschema is needed (apt-get install python3-jsonschema)")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="npullm_run")
    ap.add_argument("--model", required=True, help="a GGUF model with its vocabulary")
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("-n", type=int, default=512)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt", default="JSON:")
    ap.add_argument("-l", action="append", default=[], help="npullm_run's -l TOKEN+BIAS")
    ap.add_argument("dir", nargs="?",
                    default=os.path.join(here, "..", "..", "shared", "vectors", "maskbench"))
    a = ap.parse_args()
    files = sorted(f for f in os.listdir(a.dir) if f.endswith(".json"))[::a.every][:a.limit]
    counts = {"valid": 0, "invalid": 0, "cut": 0, "refused": 0}
    shares, shares_free = [], []
    print("| file | tokens | result | sampler share of decode |")
    print("|---|---:|---|---:|")
    for name in files:
        with open(os.path.join(a.dir, name), encoding="utf-8") as f:
            schema = json.load(f)["schema"]
        text = json.dumps(schema)
        bias = [x for b in a.l for x in ("-l", b)]
        cmd = [a.run, "-m", a.model, "-p", a.prompt, "-j", text, "-n", str(a.n), "--temp", "1",
               "--seed", str(a.seed), "-t", str(a.t)] + bias
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            counts["refused"] += 1
            why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "?"
            print(f"| {name} | - | refused: {why[:90]} | - |")
            continue
        out = r.stdout
        if out.startswith(a.prompt):
            out = out[len(a.prompt):]
        out = out.rstrip("\n")
        m = re.search(r"generation:\s+(\d+) tokens", r.stderr)
        tokens = int(m.group(1)) if m else -1
        s = re.search(r"sampling:\s+[0-9.]+ s of the decode steps' \(([0-9.]+) %\)", r.stderr)
        share = float(s.group(1)) if s else float("nan")
        if s:
            shares.append(share)
        try:
            value = json.loads(out)
        except json.JSONDecodeError:
            if tokens >= a.n:
                counts["cut"] += 1
                print(f"| {name} | {tokens} | cut at -n {a.n} | {share:.2f} % |")
            else:
                counts["invalid"] += 1
                print(f"| {name} | {tokens} | NOT JSON: {out[:80]!r} | {share:.2f} % |")
            continue
        try:
            jsonschema.validators.validator_for(schema)(schema).validate(value)
        except jsonschema.exceptions.ValidationError as e:
            counts["invalid"] += 1
            print(f"| {name} | {tokens} | INVALID: {e.message[:80]} | {share:.2f} % |")
            continue
        counts["valid"] += 1
        print(f"| {name} | {tokens} | valid | {share:.2f} % |")
        # The same number of steps without the grammar: the sampler's own share.
        free = subprocess.run([a.run, "-m", a.model, "-p", a.prompt, "-n", str(max(tokens, 2)),
                               "--temp", "1", "--seed", str(a.seed), "-t", str(a.t)] + bias,
                              capture_output=True, text=True, check=False)
        s = re.search(r"sampling:\s+[0-9.]+ s of the decode steps' \(([0-9.]+) %\)", free.stderr)
        if s:
            shares_free.append(float(s.group(1)))
    print()
    print(f"files {len(files)}: valid {counts['valid']}, invalid {counts['invalid']}, "
          f"cut at -n {counts['cut']}, refused by npullm {counts['refused']}")
    if shares and shares_free:
        mean = sum(shares) / len(shares)
        mean_free = sum(shares_free) / len(shares_free)
        print(f"sampler share of the decode time: with the grammar {mean:.2f} % (mean of "
              f"{len(shares)} runs), without {mean_free:.2f} % (same step counts): the grammar "
              f"adds {mean - mean_free:.2f} % of a decode step")
    return 1 if counts["invalid"] else 0


if __name__ == "__main__":
    sys.exit(main())
