"""Training data from the target itself: greedy continuations of the project's prompts.

For every prompt the target (llama.cpp, exact numerics) decodes greedily and we
record the tokens, the target's final hidden state at every fed position from
``window`` tokens before the end of the prompt on (what draft heads read), and
the top-k logits at every output position (for distilling draft models).

Examples are written in shards of 50 (``data/a-0000.npz`` ...), each written
atomically, so an interrupted run resumes at the first missing shard.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backends.base import ForwardRequest
from .prompts import stage_a_prompts, stage_b_prompts

SHARD = 50


@dataclass
class DataConfig:
    """What to generate.

    Attributes:
        prompts_a: stage-A prompts (topic x task templates).
        prompts_b: stage-B prompts (built on stage-A answers).
        max_new_tokens: greedy tokens per prompt.
        window: prompt positions before the end whose hidden states are kept.
        topk: logits kept per output position.
        prompt_set: 1 (the original templates) or 2 (adds more kinds of chat requests; see
            :mod:`speculative.training.prompts`).
    """

    prompts_a: int = 600
    prompts_b: int = 300
    max_new_tokens: int = 96
    window: int = 32
    topk: int = 32
    seed: int = 0
    prompt_set: int = 2


def _run_example(backend, prompt_ids: list[int], cfg: DataConfig) -> dict:
    backend.truncate(0, 0)
    L = len(prompt_ids)
    split = max(0, L - cfg.window)
    if split:
        backend.forward([ForwardRequest(0, prompt_ids[:split], logits="none")])
    out = backend.forward([ForwardRequest(0, prompt_ids[split:], logits="all", hidden=True)])[0]
    feats = [out.hidden.astype(np.float16)]
    rows = [out.logits[-1]]
    toks: list[int] = []
    eos = backend.eos_token_ids
    while True:
        lg = rows[-1]
        t = int(np.argmax(lg))
        toks.append(t)
        if t in eos or len(toks) >= cfg.max_new_tokens:
            break
        o = backend.forward([ForwardRequest(0, [t], logits="all", hidden=True)])[0]
        feats.append(o.hidden.astype(np.float16))
        rows.append(o.logits[-1].copy())
    lg = np.stack([np.asarray(r, dtype=np.float32) for r in rows])  # [n_out, V]
    k = min(cfg.topk, lg.shape[1])
    idx = np.argpartition(-lg, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(lg, idx, axis=1)
    m = lg.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(lg - m).sum(axis=1))).astype(np.float32)
    backend.truncate(0, 0)
    return {
        "tokens": np.asarray(prompt_ids + toks, dtype=np.int32),
        "prompt_len": L,
        "feat_start": split,
        "feats": np.concatenate(feats),
        "topk_ids": idx.astype(np.int32),
        "topk_vals": vals.astype(np.float16),
        "lse": lse,
    }


def _save_shard(path: Path, examples: list[dict], texts: list[str]) -> None:
    def cat(key):
        return np.concatenate([e[key] for e in examples])

    arrays = {
        "tokens": cat("tokens"),
        "tokens_len": np.asarray([len(e["tokens"]) for e in examples], dtype=np.int64),
        "prompt_len": np.asarray([e["prompt_len"] for e in examples], dtype=np.int64),
        "feat_start": np.asarray([e["feat_start"] for e in examples], dtype=np.int64),
        "feats": cat("feats"),
        "feats_len": np.asarray([len(e["feats"]) for e in examples], dtype=np.int64),
        "topk_ids": cat("topk_ids"),
        "topk_vals": cat("topk_vals"),
        "lse": cat("lse"),
        "out_len": np.asarray([len(e["lse"]) for e in examples], dtype=np.int64),
    }
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, **arrays)
    (path.with_suffix(".texts.json")).write_text(json.dumps(texts))
    os.replace(tmp, path)


def load_shards(data_dir: Path) -> list[dict]:
    """All examples of a data folder, in shard order (one dict of arrays per example)."""
    out = []
    for p in sorted(data_dir.glob("*.npz")):
        if ".tmp" in p.name:
            continue
        z = np.load(p)
        offs = {k: np.concatenate([[0], np.cumsum(z[k + "_len"])]) for k in ("tokens", "feats", "out")}
        for i in range(len(z["tokens_len"])):
            t0, t1 = offs["tokens"][i], offs["tokens"][i + 1]
            f0, f1 = offs["feats"][i], offs["feats"][i + 1]
            o0, o1 = offs["out"][i], offs["out"][i + 1]
            out.append({
                "tokens": z["tokens"][t0:t1],
                "prompt_len": int(z["prompt_len"][i]),
                "feat_start": int(z["feat_start"][i]),
                "feats": z["feats"][f0:f1],
                "topk_ids": z["topk_ids"][o0:o1],
                "topk_vals": z["topk_vals"][o0:o1],
                "lse": z["lse"][o0:o1],
            })
    return out


def generate_data(target: str, out_dir: Path, cfg: DataConfig, progress: bool = True, n_ctx: int = 2048) -> Path:
    """Generate (or finish generating) the training data of ``target`` under ``out_dir/data``."""
    from tqdm import tqdm

    from ..backends import load_backend

    data_dir = out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    backend = load_backend(target, "llama.cpp", n_ctx=n_ctx)
    chat = backend.chat_template is not None

    def encode(p: str) -> list[int]:
        ids = backend.apply_chat_template([{"role": "user", "content": p}]) if chat else backend.encode(p)
        return ids[-(n_ctx - cfg.max_new_tokens - 8):]

    try:
        for stage in ("a", "b"):
            if stage == "a":
                prompts = stage_a_prompts(cfg.prompts_a, cfg.seed, cfg.prompt_set)
            else:
                passages = []
                for p in sorted(data_dir.glob("a-*.texts.json")):
                    passages += json.loads(p.read_text())
                prompts = stage_b_prompts(passages, cfg.seed)[: cfg.prompts_b]
            n_shards = (len(prompts) + SHARD - 1) // SHARD
            todo = [i for i in range(n_shards) if not (data_dir / f"{stage}-{i:04d}.npz").exists()]
            bar = tqdm(total=len(prompts), initial=(n_shards - len(todo)) * SHARD, desc=f"data {stage}",
                       unit="prompt", disable=not progress)
            for i in todo:
                chunk = prompts[i * SHARD : (i + 1) * SHARD]
                examples, texts = [], []
                for prompt in chunk:
                    ex = _run_example(backend, encode(prompt), cfg)
                    examples.append(ex)
                    texts.append(backend.decode(ex["tokens"][ex["prompt_len"] :].tolist()))
                    bar.update(1)
                _save_shard(data_dir / f"{stage}-{i:04d}.npz", examples, texts)
            bar.close()
    finally:
        backend.close()
    return data_dir


def token_frequencies(examples: list[dict], vocab_size: int) -> np.ndarray:
    """How often each token id is an output of the target in the data."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for e in examples:
        np.add.at(counts, e["tokens"][e["prompt_len"] :], 1)
    return counts


def draft_vocabulary(examples: list[dict], vocab_size: int, size: int, always: Sequence[int] = ()) -> list[int]:
    """The reduced draft vocabulary (FR-Spec, Zhao et al. 2025): ``size`` target token ids, most useful first.

    Ranked by, in order: how often the target emitted the token; how often it was among the
    target's top-k candidates (the soft labels: tokens the target finds plausible, a far wider
    sample than its greedy outputs); how often it occurs in prompts; then the lowest ids (byte-pair
    merge order, a proxy for corpus frequency). A few hundred prompts emit only a few thousand
    distinct tokens, so the later keys decide most of the vocabulary; the head's LM-head rows are
    the target's own, so it can predict tokens it never saw as labels. ``always`` ids (end of
    generation) are appended when missing.
    """
    outputs = token_frequencies(examples, vocab_size)
    candidates = np.zeros(vocab_size, dtype=np.int64)
    prompts = np.zeros(vocab_size, dtype=np.int64)
    for e in examples:
        np.add.at(candidates, e["topk_ids"].reshape(-1), 1)
        np.add.at(prompts, e["tokens"][: e["prompt_len"]], 1)
    order = np.lexsort((np.arange(vocab_size), -prompts, -candidates, -outputs))  # last key sorts first
    ids = [int(t) for t in order[:size]]
    have = set(ids)
    return ids + [int(t) for t in always if int(t) not in have]
