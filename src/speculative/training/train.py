"""``speculative train-drafter``: train a drafter on the target's own outputs, resumably.

Pipeline (each stage resumes where it stopped):
  1. data: greedy continuations of the project's prompts, with hidden states and
     top-k logits (:mod:`speculative.training.data`);
  2. the draft vocabulary: the ``draft_vocab`` most frequent output tokens (FR-Spec);
  3. training, with a checkpoint after every epoch (model, optimizer, epoch);
  4. export of the drafter folder (``drafter.json`` + ``head.safetensors``);
  5. a held-out acceptance estimate on the development prompts
     (``src/speculative/data/devset.jsonl``): greedy, k = 4, mean accepted tokens per step, which
     also chooses what the head's ``drafter.json`` recommends for inference: its precision
     (:func:`pick_inference_precision`) and how much of its draft vocabulary to use
     (:func:`pick_draft_vocab`).

EAGLE loss (Li et al. 2024, section 4.2): cross-entropy of the target's next
token through the frozen LM-head rows, plus a Smooth-L1 regression of the next
feature; inputs get Gaussian noise, and a second unrolled step feeds the head's
own predicted features, as it sees them when drafting (EAGLE-3's training-time
test, Li et al. 2025). Medusa loss: cross-entropy of token t+1+k for head k.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .checkpoint import EpochCheckpoint, cosine_schedule, train_epochs
from .config import TrainConfig
from .data import draft_vocabulary, generate_data, load_training_examples
# re-exported for scripts that import them from here; the heads' evaluation calls recommend.evaluate_drafter, so
# that is the name to replace in a test
from .recommend import (  # noqa: F401
    MIN_AUTO_DRAFT_VOCAB,
    check_inference_vocab,
    evaluate_drafter,
    pick_draft_vocab,
    pick_inference_precision,
    recommend_draft_vocab,
    recommend_inference_precision,
)


def training_dtype(precision: str, device) -> str:
    """The compute precision of training: ``precision`` unless "auto", which picks bf16 autocast where
    the hardware multiplies bf16 natively (x86 AVX512-BF16 or AMX, or a CUDA device with bf16), else fp32.

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, got {precision!r}")
    if precision != "auto":
        return precision
    import torch

    if str(device).startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    from ..kernels import cpu_info

    flags = cpu_info().flags
    return "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"


def token_subset(examples: list[dict], n_tokens: int, seed: int) -> list[dict]:
    """A seeded random subset of ``examples`` holding at least ``n_tokens`` feature positions (all of
    them if there are fewer); a smaller budget's subset is a prefix of a larger one's, so the points
    of a learning curve are nested."""
    order = np.random.default_rng(seed + 7919).permutation(len(examples))
    out, total = [], 0
    for i in order:
        if total >= n_tokens:
            break
        out.append(examples[i])
        total += len(examples[i]["feats"])
    return out


def _batches(examples, batch_size, rng):
    order = rng.permutation(len(examples))
    for i in range(0, len(order), batch_size):
        yield [examples[j] for j in order[i : i + batch_size]]


def _eagle_tensors(batch, vocab_index, torch):
    """Pad a batch to [B, T]: features f_j, next tokens x_{j+1}, target features f_{j+1}, labels x_{j+2},
    and the target's own distribution of x_{j+2} over its top-k tokens (soft labels, [B, T, k])."""
    T = max(len(e["feats"]) for e in batch)
    H = batch[0]["feats"].shape[1]
    K = batch[0]["topk_ids"].shape[1]
    B = len(batch)
    feats = np.zeros((B, T, H), np.float32)
    nxt = np.zeros((B, T), np.int64)
    tfeat = np.zeros((B, T, H), np.float32)
    reg_mask = np.zeros((B, T), bool)
    labels = np.full((B, T), -100, np.int64)
    soft_ids = np.zeros((B, T, K), np.int64)
    soft_p = np.zeros((B, T, K), np.float32)
    lookup = np.vectorize(lambda t: vocab_index.get(int(t), -1), otypes=[np.int64])
    for b, e in enumerate(batch):
        f, toks, fs, pl = e["feats"], e["tokens"], e["feat_start"], e["prompt_len"]
        n = len(f)
        feats[b, :n] = f
        js = fs + np.arange(n)
        nxt[b, :n] = toks[js + 1]
        tfeat[b, : n - 1] = f[1:]
        reg_mask[b, : n - 1] = True
        for i in range(n):
            t = int(js[i]) + 2
            if pl <= t < len(toks):
                labels[b, i] = vocab_index.get(int(toks[t]), -100)
                o = t - pl
                ids = lookup(e["topk_ids"][o])
                p = np.exp(e["topk_vals"][o].astype(np.float32) - e["lse"][o])
                keep = ids >= 0
                soft_ids[b, i] = np.where(keep, ids, 0)
                soft_p[b, i] = np.where(keep, p, 0.0)
    t = torch.from_numpy
    return t(feats), t(nxt), t(tfeat), t(reg_mask), t(labels), t(soft_ids), t(soft_p)


def _soft_ce(logits, soft_ids, soft_p, labels, torch):
    """Cross-entropy against the target's distribution (its top-k mass inside the draft vocabulary)."""
    logq = torch.log_softmax(logits, dim=-1)
    picked = logq.gather(-1, soft_ids)
    mask = labels >= 0
    per = -(soft_p * picked).sum(-1) / soft_p.sum(-1).clamp_min(1e-6)
    return per[mask].mean() if mask.any() else logits.sum() * 0


def _medusa_tensors(batch, vocab_index, K, torch):
    rows, labels = [], []
    for e in batch:
        f, toks, fs, pl = e["feats"], e["tokens"], e["feat_start"], e["prompt_len"]
        for i in range(len(f)):
            j = fs + i
            if j + 1 < pl:
                continue
            lab = []
            for k in range(1, K + 1):
                t = j + 1 + k
                lab.append(vocab_index.get(int(toks[t]), -100) if t < len(toks) else -100)
            rows.append(f[i])
            labels.append(lab)
    return torch.from_numpy(np.asarray(rows, np.float32)), torch.from_numpy(np.asarray(labels, np.int64))


def default_head_config(method: str, hidden_size: int, vocab_ids: list[int], target: str, target_vocab: int):
    """Head dimensions for a target of this hidden size: heads of 64 dims, MLP twice the width."""
    from ..drafters.head_nets import HeadConfig

    n_heads = max(1, hidden_size // 64)
    return HeadConfig(
        method=method, hidden_size=hidden_size, vocab_ids=list(map(int, vocab_ids)), n_heads=n_heads,
        n_kv_heads=max(1, n_heads // 4) if n_heads % 4 == 0 else n_heads, head_dim=64,
        intermediate_size=2 * hidden_size, target=target, target_vocab_size=int(target_vocab),
    )


def train_drafter(target: str, out_dir: Path, cfg: TrainConfig, progress: bool = True) -> dict:
    """Run (or resume) the whole pipeline; returns the metrics written to ``metrics.json``."""
    import torch

    from ..backends import load_backend
    from ..cache import atomic_path
    from ..drafters.base import HEAD_PRECISIONS
    from ..drafters.heads import target_embedding_matrices
    from ..drafters.head_nets import TargetWeights, build_head, save_head

    if cfg.unroll_context not in ("own", "target"):
        raise ValueError(f"unroll_context must be 'own' or 'target', got {cfg.unroll_context!r}")
    if cfg.inference_precision not in ("auto", *HEAD_PRECISIONS):
        raise ValueError(f"inference_precision must be 'auto', 'int8' or 'fp32', got {cfg.inference_precision!r}")
    if cfg.method != "eagle" and cfg.inference_precision != "auto":
        raise ValueError(f"inference_precision {cfg.inference_precision!r}: only EAGLE heads choose one ({cfg.method} "
                         "heads run fp32)")
    check_inference_vocab(cfg.inference_vocab, cfg.method, cfg.draft_vocab)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _restore_published(out_dir / "drafter")  # an earlier run killed while publishing its head
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device or "cpu")
    (out_dir / "train_config.json").write_text(json.dumps(asdict(cfg), indent=1))
    t_start = time.time()
    data_dir = generate_data(target, Path(cfg.data_from) if cfg.data_from else out_dir, cfg.data, progress=progress,
                             backend=cfg.data_backend, device=cfg.device)
    t_data = time.time() - t_start
    examples = load_training_examples([data_dir] + [Path(extra) / "data" for extra in cfg.extra_data])
    if not examples:
        raise RuntimeError("no training data was generated")
    if cfg.train_tokens:
        examples = token_subset(examples, cfg.train_tokens, cfg.seed)
    n_tokens = sum(len(e["feats"]) for e in examples)

    backend = load_backend(target, "llama.cpp", n_ctx=512, check_numerics=False)
    try:
        embed, head_w = target_embedding_matrices(backend)
        V, H = backend.vocab_size, backend.hidden_size
        eos = sorted(backend.eos_token_ids)
        target_name = backend.model_id
    finally:
        backend.close()
    vocab_ids = draft_vocabulary(examples, V, min(cfg.draft_vocab, V), always=eos)
    vocab_index = {t: i for i, t in enumerate(vocab_ids)}
    weights = TargetWeights(embed, np.asarray(head_w[np.asarray(vocab_ids)], np.float32), device=device)
    hcfg = default_head_config(cfg.method, H, vocab_ids, target_name, V)
    hcfg.medusa_heads = cfg.medusa_heads
    head = build_head(hcfg).to(device)
    if hasattr(head, "set_dropout"):
        head.set_dropout(cfg.dropout)
    params = sum(p.numel() for p in head.parameters())

    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(len(examples))
    n_val = max(1, len(examples) // 20)
    val = [examples[i] for i in perm[:n_val]]
    train = [examples[i] for i in perm[n_val:]]
    feat_scale = float(np.sqrt(np.mean([np.mean(e["feats"].astype(np.float32) ** 2) for e in train[:50]])))

    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr or 2e-3, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    sched = cosine_schedule(opt, total, warmup_steps=50)
    checkpoint = EpochCheckpoint(out_dir, head, opt, sched)

    dtype = training_dtype(cfg.precision, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def loss_of(batch, train_mode: bool):
        with autocast:
            return _loss_of(batch, train_mode)

    def _loss_of(batch, train_mode: bool):
        if cfg.method == "eagle":
            feats, nxt, tfeat, reg_mask, labels, soft_ids, soft_p = (
                x.to(device) for x in _eagle_tensors(batch, vocab_index, torch))
            emb = weights.embed_tokens(nxt)
            x = feats + (torch.randn_like(feats) * cfg.noise * feat_scale if train_mode else 0)
            unrolled = head.forward_unrolled(x, emb, 3) if cfg.unroll and cfg.unroll_context == "target" else None
            pred = unrolled[0] if unrolled else head(x, emb)
            lg = (pred @ weights.lm_head.T).float()
            ce = _soft_ce(lg, soft_ids, soft_p, labels, torch)
            reg = torch.nn.functional.smooth_l1_loss(pred[reg_mask].float() / feat_scale, tfeat[reg_mask] / feat_scale)
            loss = ce + cfg.reg_weight * reg
            acc = ((lg.argmax(-1) == labels) & (labels >= 0)).sum().item() / max(1, (labels >= 0).sum().item())
            if unrolled:
                for w, out in zip((0.5, 0.25), unrolled[1:]):
                    loss = loss + w * _soft_ce((out @ weights.lm_head.T).float(), soft_ids, soft_p, labels, torch)
            elif cfg.unroll:
                # unrolled steps: position j's input feature is the head's own prediction made at j-1,
                # as when drafting (EAGLE-3's training-time test)
                prev = pred
                for w in (0.5, 0.25):
                    xs = torch.cat([feats[:, :1], prev[:, :-1]], dim=1)
                    prev = head(xs, emb)
                    loss = loss + w * _soft_ce((prev @ weights.lm_head.T).float(), soft_ids, soft_p, labels, torch)
            return loss, acc
        rows, labels = _medusa_tensors(batch, vocab_index, cfg.medusa_heads, torch)
        if len(rows) == 0:
            return None, 0.0
        rows, labels = rows.to(device), labels.to(device)
        hs = head(rows)  # [K, N, H]
        lg = (hs @ weights.lm_head.T).float()
        loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels.T.reshape(-1), ignore_index=-100)
        acc = ((lg[0].argmax(-1) == labels[:, 0]) & (labels[:, 0] >= 0)).sum().item() / max(1, (labels[:, 0] >= 0).sum().item())
        return loss, acc

    def batches(epoch):
        return list(_batches(train, cfg.batch_size, np.random.default_rng(cfg.seed + epoch)))

    def validate():
        with torch.no_grad():
            vl = [loss_of(val[i : i + cfg.batch_size], False) for i in range(0, len(val), cfg.batch_size)]
        vl = [(x.item(), a) for x, a in vl if x is not None]
        return {"val_loss": float(np.mean([x for x, _ in vl])), "val_top1": float(np.mean([a for _, a in vl]))}

    t_train0 = time.time()
    history = train_epochs(head, checkpoint, cfg.epochs, batches, lambda b: loss_of(b, True), list(head.parameters()),
                           opt, sched, f"train {cfg.method}", progress, validate)
    t_train = time.time() - t_train0

    # the head is saved and evaluated in drafter.pending/ and only then published as drafter/: a run killed
    # during its evaluation leaves no drafter/ without its recommendation (a resumed run evaluates again)
    drafter_dir = out_dir / "drafter"
    pending = out_dir / "drafter.pending"
    shutil.rmtree(pending, ignore_errors=True)
    save_head(head.to("cpu"), hcfg, pending)
    metrics = {
        "target": target_name,
        "method": cfg.method,
        "head_parameters": params,
        "draft_vocab": len(vocab_ids),
        "examples": len(examples),
        "tokens": n_tokens,
        "data_seconds": t_data,
        "train_seconds": t_train,
        "precision": dtype,
        "history": history,
    }
    precision, heldout, metrics["inference_precision"] = recommend_inference_precision(target, pending, hcfg, cfg)
    metrics["heldout"], metrics["inference_vocab"] = recommend_draft_vocab(target, pending, hcfg, cfg, precision,
                                                                           heldout)
    with atomic_path(out_dir / "metrics.json") as tmp:
        tmp.write_text(json.dumps(metrics, indent=1))
    _publish(pending, drafter_dir)
    return metrics


def _publish(pending: Path, folder: Path) -> None:
    """Replace ``folder`` by the finished ``pending`` folder: an earlier ``folder`` is renamed to
    ``folder.old``, ``pending`` to ``folder``, and ``folder.old`` removed. A kill between the two renames
    leaves ``folder.old`` complete, and :func:`_restore_published` puts it back at the next run's start."""
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    pending.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _restore_published(folder: Path) -> None:
    """Undo a :func:`_publish` killed between its renames: ``folder.old`` back to ``folder`` where
    ``folder`` is missing."""
    old = folder.with_name(folder.name + ".old")
    if old.is_dir() and not folder.exists():
        old.rename(folder)


def train_draft_model_pipeline(target: str, out_dir: Path, cfg: TrainConfig, n_layers: int = 2,
                               intermediate: int | None = None, progress: bool = True) -> dict:
    """draft-model method: data, distillation, GGUF + Hugging Face export, held-out estimate."""
    from ..models import resolve
    from ..gguf_io import assemble_gguf
    from .draft_model import save_layers, train_draft_model

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train_config.json").write_text(json.dumps({**asdict(cfg), "n_layers": n_layers,
                                                           "intermediate": intermediate}, indent=1))
    t0 = time.time()
    data_dir = generate_data(target, Path(cfg.data_from) if cfg.data_from else out_dir, cfg.data, progress=progress,
                             backend=cfg.data_backend, device=cfg.device)
    t_data = time.time() - t0
    examples = load_training_examples([data_dir] + [Path(extra) / "data" for extra in cfg.extra_data])
    res = train_draft_model(target, out_dir, n_layers, examples, epochs=cfg.epochs, batch_size=cfg.batch_size,
                            intermediate=intermediate, progress=progress, lr=cfg.lr or 5e-4, device=cfg.device)
    draft = res.pop("model")
    gguf_target = resolve(target).location
    drafter_dir = out_dir / "drafter"
    save_layers(draft, drafter_dir, target, gguf_target)
    gguf_path = assemble_gguf(drafter_dir, gguf_target)
    export = out_dir / "draft.gguf"
    export.write_bytes(gguf_path.read_bytes())
    draft.save_pretrained(str(out_dir / "hf"))
    metrics = {"target": target, "method": "draft-model", "n_layers": n_layers, "data_seconds": t_data, **res,
               "gguf": str(export), "hf": str(out_dir / "hf")}
    metrics["heldout"] = evaluate_drafter(target, export, "model", n_prompts=cfg.eval_prompts)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
    return metrics
