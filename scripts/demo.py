"""`make demo`: one request decoded plainly and speculatively, side by side: the same text, two speeds.

The request is one a user would send to a small code assistant: rewrite a piece of code that is in the
prompt. The answer repeats much of the prompt, which is what the n-gram drafter (prompt lookup, Saxena
2023) proposes, at no cost of its own, so it is where speculation on a CPU pays most among the bundled
models and drafters (docs/benchmarks.md). Both runs are greedy on the same target with caches emptied
before each, so their times compare prefill and decoding alike; a short plain warm-up run first loads
the weights, and the verification cost T(n) is measured once (cached for later runs).

    python scripts/demo.py [--target NAME] [--drafter SPEC] [--max-new-tokens N] [--prompt TEXT]

Prints the answer once when both texts are identical (token for token), else both and the first
difference; then both speeds and the speedup. Exit status 0, or 1 when the texts differ. Bad options or
a missing model: a one-line error, exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time

CODE = '''def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, age, city = line.strip().split(",")
            users.append({"name": name, "age": int(age), "city": city})
    return users


def adults(users):
    result = []
    for user in users:
        if user["age"] >= 18:
            result.append(user)
    return result


def by_city(users):
    groups = {}
    for user in users:
        groups.setdefault(user["city"], []).append(user)
    return groups
'''
PROMPT = ("Add type hints to the functions in this Python code and reply with the complete code.\n\n```python\n"
          + CODE + "```")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--draft-policy", default="adaptive", choices=("adaptive", "fixed"))
    args = ap.parse_args(argv)

    from speculative import SpeculativeGenerator
    from speculative.errors import SpeculativeError

    try:
        spec = SpeculativeGenerator.from_pretrained(args.target, drafter=args.drafter)
    except SpeculativeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plain = SpeculativeGenerator(spec.target)  # the same model, no drafter
    try:
        ids = spec.encode_prompt(args.prompt)
        plain.generate(ids, max_new_tokens=8)  # warm-up: the weights in memory
        spec.cost_model  # T(n), measured once on this machine (then cached) for the adaptive policy
        runs = {}
        for name, gen in (("plain", plain), ("speculative", spec)):
            spec.reset_caches()  # no prompt prefix reused from the run before
            t0 = time.perf_counter()
            runs[name] = (gen.generate(ids, max_new_tokens=args.max_new_tokens, draft_policy=args.draft_policy),
                          time.perf_counter() - t0)
    except SpeculativeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        spec.close()
    (a, ta), (b, tb) = runs["plain"], runs["speculative"]
    print(f"{args.target} on llama.cpp, greedy; drafter {spec.drafter.description}; prompt of {len(ids)} tokens:\n")
    print(args.prompt.rstrip() + "\n")
    if a.token_ids == b.token_ids:
        print(f"--- the answer, plain and speculative: identical, {len(a.token_ids)} tokens ---")
        print(a.text.rstrip())
    else:
        i = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                 min(len(a.token_ids), len(b.token_ids)))
        print(f"--- the answers differ from token {i} on ---")
        print(f"plain:\n{a.text.rstrip()}\n\nspeculative:\n{b.text.rstrip()}")
    s = b.stats
    print("---")
    print(f"plain decoding:        {len(a.token_ids):4d} tokens in {ta:5.2f} s = {len(a.token_ids) / ta:6.1f} tokens/s")
    print(f"speculative decoding:  {len(b.token_ids):4d} tokens in {tb:5.2f} s = {len(b.token_ids) / tb:6.1f} tokens/s, "
          f"{s.mean_accepted_tokens:.2f} tokens per target step")
    print(f"speedup: {ta / tb:.2f}x (end to end, prefill included; one run each on this machine)")
    return 0 if a.token_ids == b.token_ids else 1


if __name__ == "__main__":
    sys.exit(main())
