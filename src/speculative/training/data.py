"""Training data from the target itself: greedy continuations of the project's prompts.

For every prompt the target (llama.cpp, exact numerics) decodes greedily and we
record the tokens, the target's final hidden state at every fed position from
``window`` tokens before the end of the prompt on (what draft heads read), and
the top-k logits at every output position (for distilling draft models).

Examples are written in shards of 50 (``data/a-0000.npz`` ...), each written
atomically, so an interrupted run resumes at the first missing shard.

Optionally (``text_tokens``), text the target reads rather than writes: the Python
standard library's source, which every machine has, cut into ``TEXT_CHUNK``-token
pieces that the target prefills in one pass each (far more tokens per second than
decoding); its hidden state and top-k logits at every position are kept, as for
an answer (EAGLE's own training data is fixed text too: Li et al. 2024, section 5).
Those examples live in ``data/t-0000.npz`` ... shards of ``TEXT_SHARD`` pieces.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backends.base import ForwardRequest
from .prompts import clean_request, self_instruct_meta_prompt, self_instruct_pool, stage_a_prompts, stage_b_prompts

SHARD = 50
TEXT_CHUNK = 256  # tokens per prefilled piece of standard-library source
TEXT_SHARD = 40  # pieces per text shard (about 10,000 tokens)


@dataclass
class DataConfig:
    """What to generate.

    Attributes:
        prompts_a: stage-A prompts (topic x task templates).
        prompts_b: stage-B prompts (built on stage-A answers).
        max_new_tokens: greedy tokens per prompt.
        window: prompt positions before the end whose hidden states are kept.
        topk: logits kept per output position.
        prompt_set: 1 (the original templates), 2 (adds more kinds of chat requests) or 3
            (half set 2, half requests the target writes itself); see
            :mod:`speculative.training.prompts`.
        parallel: prompts decoded at once (one sequence each, batched forwards); the
            data does not depend on it.
        text_tokens: tokens of the Python standard library's source to prefill as well
            (0: none); see :func:`stdlib_pieces`.
    """

    prompts_a: int = 600
    prompts_b: int = 300
    max_new_tokens: int = 96
    window: int = 32
    topk: int = 32
    seed: int = 0
    prompt_set: int = 2
    parallel: int = 16
    text_tokens: int = 0


def top_logits(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a training example keeps of each logits row: the k largest logits (unordered) and the row's
    log-sum-exp, from which the distillation loss rebuilds the target's probabilities of those k tokens.

    Args:
        logits: [n, V] float32.
        k: 1 <= k <= V.

    Returns:
        (ids [n, k] int, their logits [n, k] float32, log-sum-exp [n] float32).
    """
    idx = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(logits, idx, axis=1)
    m = logits.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))).astype(np.float32)
    return idx, vals, lse


def _decode_lockstep(backend, first, pick, go_on, hidden: bool = False) -> list[list[int]]:
    """Decode sequences ``0..n-1`` in lockstep, one batched forward per step.

    ``first`` holds each sequence's output for its prompt; ``pick(i, out)`` turns an output
    into sequence i's next token (and may record it); a sequence stops after a token for
    which ``go_on(tokens so far)`` is false. Returns each sequence's new tokens.
    """
    toks: list[list[int]] = [[] for _ in first]
    nxt = [pick(i, o) for i, o in enumerate(first)]
    active = list(range(len(first)))
    while active:
        step = []
        for i in active:
            toks[i].append(nxt[i])
            if go_on(toks[i]):
                step.append(i)
        active = step
        if active:
            outs = backend.forward([ForwardRequest(i, [toks[i][-1]], logits="last", hidden=hidden) for i in active])
            for i, o in zip(active, outs, strict=True):
                nxt[i] = pick(i, o)
    return toks


def _run_examples(backend, prompts: list[list[int]], cfg: DataConfig) -> list[dict]:
    """Greedy continuations of up to ``backend.max_sequences`` prompts, decoded in lockstep.

    Prompt ``i`` lives in sequence ``i``; every decoding step feeds one token of each
    unfinished sequence in one batched forward (a sequence's cache is its own stream, so
    its numbers do not depend on the others), which on CPU costs far less per token than
    decoding the prompts one after another.
    """
    n = len(prompts)
    for i in range(n):
        backend.truncate(i, 0)
    splits = [max(0, len(p) - cfg.window) for p in prompts]
    heads = [ForwardRequest(i, p[:s], logits="none") for i, (p, s) in enumerate(zip(prompts, splits, strict=True)) if s]
    if heads:
        backend.forward(heads)
    outs = backend.forward([ForwardRequest(i, p[s:], logits="all", hidden=True)
                            for i, (p, s) in enumerate(zip(prompts, splits, strict=True))])
    k = min(cfg.topk, backend.vocab_size)
    feats: list[list[np.ndarray]] = [[] for _ in range(n)]
    rows: list[list[tuple]] = [[] for _ in range(n)]  # per output position: (top-k ids, their logits, logsumexp)

    def record(i, out) -> int:
        lg = np.asarray(out.logits[-1:], dtype=np.float32)
        idx, vals, lse = top_logits(lg, k)
        rows[i].append((idx[0], vals[0], lse[0]))
        feats[i].append(out.hidden.astype(np.float16))
        return int(np.argmax(lg[0]))

    eos = backend.eos_token_ids
    toks = _decode_lockstep(backend, outs, record, lambda t: t[-1] not in eos and len(t) < cfg.max_new_tokens,
                            hidden=True)
    examples = []
    for i in range(n):
        backend.truncate(i, 0)
        examples.append({
            "tokens": np.asarray(prompts[i] + toks[i], dtype=np.int32),
            "prompt_len": len(prompts[i]),
            "feat_start": splits[i],
            "feats": np.concatenate(feats[i]),
            "topk_ids": np.stack([r[0] for r in rows[i]]).astype(np.int32),
            "topk_vals": np.stack([r[1] for r in rows[i]]).astype(np.float16),
            "lse": np.asarray([r[2] for r in rows[i]], dtype=np.float32),
        })
    return examples


def stdlib_sources(seed: int) -> list[Path]:
    """The ``.py`` files of this Python's standard library (not site-packages), in a seeded order."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    random.Random(seed).shuffle(files)
    return files


def stdlib_pieces(encode, n_tokens: int, seed: int, chunk: int = TEXT_CHUNK):
    """Yield ``(label, token ids)`` pieces of ``chunk`` tokens of standard-library source, ``n_tokens``
    in all (fewer if the library is smaller), in a deterministic order for a given seed and Python."""
    made = 0
    for path in stdlib_sources(seed):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = encode(text)
        for i in range(0, len(ids) - chunk + 1, chunk):
            if made + chunk > n_tokens:
                return
            yield f"stdlib:{path.name}#{i // chunk}", ids[i : i + chunk]
            made += chunk


def _run_text(backend, toks: list[int], topk: int) -> dict:
    """Prefill one piece in sequence 0 and keep every position's hidden state and top-k logits.

    The example holds the piece as ``tokens`` with ``prompt_len`` 1 and ``feat_start`` 0: feature
    rows are positions 0..n-2 and output rows predict tokens 1..n-1, the layout of an answer.
    """
    k = min(topk, backend.vocab_size)
    backend.truncate(0, 0)
    res = backend.forward([ForwardRequest(0, toks, logits="all", hidden=True)])[0]
    idx, vals, lse = top_logits(np.asarray(res.logits[:-1], dtype=np.float32), k)
    example = {
        "tokens": np.asarray(toks, dtype=np.int32), "prompt_len": 1, "feat_start": 0,
        "feats": np.asarray(res.hidden[:-1], dtype=np.float16),  # a copy (float16), before the next forward
        "topk_ids": idx.astype(np.int32), "topk_vals": vals.astype(np.float16), "lse": lse,
    }
    backend.truncate(0, 0)
    return example


def _text_stage(backend, data_dir: Path, cfg: DataConfig, progress: bool) -> None:
    """Prefill ``cfg.text_tokens`` tokens of standard-library source into ``t-NNNN.npz`` shards (resumable)."""
    from tqdm import tqdm

    pieces = list(stdlib_pieces(backend.encode, cfg.text_tokens, cfg.seed))
    n_shards = (len(pieces) + TEXT_SHARD - 1) // TEXT_SHARD
    todo = [i for i in range(n_shards) if not (data_dir / f"t-{i:04d}.npz").exists()]
    bar = tqdm(total=len(pieces) * TEXT_CHUNK, initial=min(len(pieces), (n_shards - len(todo)) * TEXT_SHARD) * TEXT_CHUNK,
               desc="data text", unit="tok", unit_scale=True, disable=not progress)
    for i in todo:
        chunk = pieces[i * TEXT_SHARD : (i + 1) * TEXT_SHARD]
        examples = []
        for label, toks in chunk:
            examples.append(_run_text(backend, toks, cfg.topk))
            bar.update(len(toks))
        _save_shard(data_dir / f"t-{i:04d}.npz", examples, [label for label, _ in chunk])
    bar.close()


def _left_padded(backend, seqs: list[list[int]]):
    """``(input_ids, attention_mask, pad_id)`` of token lists, left-padded to one length
    (``[n, L]`` int64 on the backend's device), as transformers' batched ``generate`` wants."""
    import torch

    L = max(len(q) for q in seqs)
    tok = backend.tokenizer
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else sorted(backend.eos_token_ids)[0])
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, L - len(q) :] = torch.tensor(q, dtype=torch.long)
        attn[i, L - len(q) :] = 1
    return ids.to(backend.device), attn.to(backend.device), pad


def _run_examples_hf(backend, prompts: list[list[int]], cfg: DataConfig) -> list[dict]:
    """:func:`_run_examples` on the transformers backend: one batched, left-padded greedy
    ``generate`` (transformers' own batching; the way to generate data at scale on a GPU)."""
    import torch

    model = backend.model
    ids, attn, pad = _left_padded(backend, prompts)
    Lmax = ids.shape[1]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=cfg.max_new_tokens,
                             do_sample=False, num_beams=1, eos_token_id=sorted(backend.eos_token_ids), pad_token_id=pad,
                             output_hidden_states=True, output_logits=True, return_dict_in_generate=True)
    seqs = out.sequences[:, Lmax:].cpu().numpy()
    # hidden_states[step][-1]: the final hidden state (after the final norm) of the step's new positions
    h0 = out.hidden_states[0][-1].float().cpu().numpy()  # [n, Lmax, H]
    hs = [s[-1][:, -1].float().cpu().numpy() for s in out.hidden_states[1:]]  # per step [n, H]
    logits = torch.stack([x.float() for x in out.logits], 1)  # [n, steps, V]
    k = min(cfg.topk, logits.shape[-1])
    top = torch.topk(logits, k, dim=-1)
    lse = torch.logsumexp(logits, dim=-1).cpu().numpy()
    top_ids, top_vals = top.indices.cpu().numpy(), top.values.cpu().numpy()
    eos = backend.eos_token_ids
    examples = []
    for i, p in enumerate(prompts):
        toks = []
        for t in seqs[i].tolist():
            toks.append(int(t))
            if t in eos:
                break
        m = len(toks)
        split = max(0, len(p) - cfg.window)
        f = [h0[i, Lmax - len(p) + split :]] + [hs[s][i][None] for s in range(m - 1)]
        examples.append({
            "tokens": np.asarray(p + toks, dtype=np.int32),
            "prompt_len": len(p),
            "feat_start": split,
            "feats": np.concatenate(f).astype(np.float16),
            "topk_ids": top_ids[i, :m].astype(np.int32),
            "topk_vals": top_vals[i, :m].astype(np.float16),
            "lse": lse[i, :m].astype(np.float32),
        })
    return examples


def _sample_lines(backend, texts: list[str], rng: np.random.Generator, max_tokens: int = 48) -> list[str]:
    """Sample one line continuing each plain text (temperature 1, top-k 50), in lockstep."""
    from ..config import SamplingParams
    from ..sampling import process_probs, sample_from

    params = SamplingParams(temperature=1.0, top_k=50)
    if backend.name == "transformers":
        return _sample_lines_hf(backend, texts, rng, params, max_tokens)
    n = len(texts)
    for i in range(n):
        backend.truncate(i, 0)
    outs = backend.forward([ForwardRequest(i, backend.encode(t), logits="last") for i, t in enumerate(texts)])
    eos = backend.eos_token_ids
    toks = _decode_lockstep(backend, outs, lambda i, o: sample_from(process_probs(o.logits[-1], params), rng),
                            lambda t: t[-1] not in eos and "\n" not in backend.decode(t) and len(t) < max_tokens)
    for i in range(n):
        backend.truncate(i, 0)
    return [backend.decode(t) for t in toks]


def _sample_lines_hf(backend, texts, rng, params, max_tokens: int) -> list[str]:
    """:func:`_sample_lines` with transformers' batched, left-padded ``generate`` (seeded from ``rng``)."""
    import torch

    ids, attn, pad = _left_padded(backend, [backend.encode(t) for t in texts])
    L = ids.shape[1]
    torch.manual_seed(int(rng.integers(2**31)))
    with torch.inference_mode():
        out = backend.model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_tokens, do_sample=True,
                                     temperature=params.temperature, top_k=params.top_k, top_p=1.0,
                                     eos_token_id=sorted(backend.eos_token_ids), pad_token_id=pad)
    eos = backend.eos_token_ids
    return [backend.decode([t for t in row.tolist() if t not in eos and t != pad]) for row in out[:, L:].cpu()]


def self_instruct_prompts(backend, n: int, seed: int, progress: bool = True) -> list[str]:
    """``n`` distinct requests written by the target (continuing few-shot lists of set-2 requests)."""
    from tqdm import tqdm

    from ..bench.datasets import load_questions

    pool = self_instruct_pool(seed)
    prng = random.Random(seed)
    rng = np.random.default_rng(seed)
    # never a benchmark or development prompt (held out), never a few-shot example
    seen = set(pool) | {t for name in ("spec-bench", "dev") for q in load_questions(name) for t in q.turns}
    out: list[str] = []
    bar = tqdm(total=n, desc="self-instruct prompts", unit="prompt", disable=not progress)
    for _ in range(8 * n // backend.max_sequences + 8):
        if len(out) >= n:
            break
        metas = [self_instruct_meta_prompt(prng, pool) for _ in range(backend.max_sequences)]
        for text in _sample_lines(backend, metas, rng):
            q = clean_request(text)
            if q and q not in seen and len(out) < n:
                seen.add(q)
                out.append(q)
                bar.update(1)
    bar.close()
    return out


def _stage_a(backend, data_dir: Path, cfg: DataConfig, progress: bool) -> list[str]:
    """Stage-A prompts; set 3's generated half is made once and kept in ``prompts-a.json``."""
    if cfg.prompt_set < 3:
        return stage_a_prompts(cfg.prompts_a, cfg.seed, cfg.prompt_set)
    saved = data_dir / "prompts-a.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    n_gen = cfg.prompts_a // 2
    written = stage_a_prompts(cfg.prompts_a - n_gen, cfg.seed, 2)
    generated = self_instruct_prompts(backend, n_gen, cfg.seed, progress)
    prompts = written + generated
    random.Random(cfg.seed).shuffle(prompts)
    tmp = saved.with_suffix(".tmp")
    tmp.write_text(json.dumps(prompts, indent=0))
    os.replace(tmp, saved)
    return prompts


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
        try:
            with np.load(p) as f:
                z = {k: f[k] for k in f.files}  # each array read once (an NpzFile reads it again at every access)
            z["tokens_len"], z["feats_len"], z["out_len"]  # noqa: B018 - a shard of another kind fails here
        except Exception as e:  # numpy/zipfile raise many types for a damaged file
            from ..errors import SpeculativeError

            raise SpeculativeError(f"{p}: damaged training data shard ({type(e).__name__}: {str(e)[:200]}); delete "
                                   "it, and the run whose data folder it is generates it again when resumed") from None
        offs = {k: np.concatenate([[0], np.cumsum(z[k + "_len"])]) for k in ("tokens", "feats", "out")}
        for i in range(len(z["tokens_len"])):
            t0, t1 = offs["tokens"][i], offs["tokens"][i + 1]
            f0, f1 = offs["feats"][i], offs["feats"][i + 1]
            o0, o1 = offs["out"][i], offs["out"][i + 1]
            out.append({
                "text": p.name.startswith("t-"),
                "tokens": z["tokens"][t0:t1],
                "prompt_len": int(z["prompt_len"][i]),
                "feat_start": int(z["feat_start"][i]),
                "feats": z["feats"][f0:f1],
                "topk_ids": z["topk_ids"][o0:o1],
                "topk_vals": z["topk_vals"][o0:o1],
                "lse": z["lse"][o0:o1],
            })
    return out


def load_training_examples(data_dirs: Sequence[Path]) -> list[dict]:
    """The examples of several data folders, each distinct prompt once (runs with other seeds
    share some prompts; greedy decoding gives them the same continuation, which would weigh
    them twice and could put one copy in training and the other in validation)."""
    out, seen = [], set()
    for d in data_dirs:
        for e in load_shards(Path(d)):
            key = (e["tokens"] if e["text"] else e["tokens"][: e["prompt_len"]]).tobytes()
            if key not in seen:
                seen.add(key)
                out.append(e)
    return out


def generate_data(target: str, out_dir: Path, cfg: DataConfig, progress: bool = True, n_ctx: int = 2048,
                  backend: str = "llama.cpp", device: str | None = None) -> Path:
    """Generate (or finish generating) the training data of ``target`` under ``out_dir/data``.

    ``backend`` "llama.cpp" (default: exact numerics, the features the llama.cpp target gives at
    drafting time) or "transformers" (batched ``generate`` on ``device``; for GPUs, where it is
    far faster; its features differ from llama.cpp's by the quantized kernels' rounding only).
    """
    from tqdm import tqdm

    from ..backends import load_backend

    data_dir = out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    backend = load_backend(target, backend, n_ctx=n_ctx, max_sequences=max(1, cfg.parallel), device=device)
    run = _run_examples_hf if backend.name == "transformers" else _run_examples
    chat = backend.chat_template is not None

    def encode(p: str) -> list[int]:
        ids = backend.apply_chat_template([{"role": "user", "content": p}]) if chat else backend.encode(p)
        return ids[-(n_ctx - cfg.max_new_tokens - 8):]

    try:
        for stage in ("a", "b"):
            if stage == "a":
                prompts = _stage_a(backend, data_dir, cfg, progress)
            else:
                passages = []
                for p in sorted(data_dir.glob("a-*.texts.json")):
                    passages += json.loads(p.read_text())
                prompts = stage_b_prompts(passages, cfg.seed)[: cfg.prompts_b]
            n_shards = (len(prompts) + SHARD - 1) // SHARD
            todo = [i for i in range(n_shards) if not (data_dir / f"{stage}-{i:04d}.npz").exists()]
            bar = tqdm(total=len(prompts), initial=min(len(prompts), (n_shards - len(todo)) * SHARD), desc=f"data {stage}",
                       unit="prompt", disable=not progress)
            for i in todo:
                chunk = prompts[i * SHARD : (i + 1) * SHARD]
                examples, texts = [], []
                for g in range(0, len(chunk), backend.max_sequences):
                    group = run(backend, [encode(p) for p in chunk[g : g + backend.max_sequences]], cfg)
                    examples += group
                    texts += [backend.decode(ex["tokens"][ex["prompt_len"] :].tolist()) for ex in group]
                    bar.update(len(group))
                _save_shard(data_dir / f"{stage}-{i:04d}.npz", examples, texts)
            bar.close()
        if cfg.text_tokens > 0:
            if backend.name == "transformers":
                raise NotImplementedError("text data (text_tokens) is generated with the llama.cpp backend only")
            _text_stage(backend, data_dir, cfg, progress)
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
