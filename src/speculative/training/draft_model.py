"""Small draft models distilled from the target (llama-architecture targets).

The draft is a transformers ``LlamaForCausalLM`` with the target's hidden size,
tokenizer, embeddings and (tied) output head, and ``n_layers`` decoder layers
initialized from evenly spaced target layers (Leviathan et al. 2023 use
independent small models; initializing from the target is the cheap way to a
well-matched one). It is trained by distillation on the target's top-k logits
at its own output positions (soft cross-entropy; Zhou et al. 2024, DistillSpec,
use the same forward-KL family).

Size counts non-embedding parameters; embeddings and the output head are the
target's, frozen, and are not stored with the drafter: the shipped folder holds
the layers only (int8 per row), and :func:`speculative.gguf_io.assemble_gguf`
writes a complete GGUF (target's token embeddings and tokenizer + the trained
layers) into the cache for llama.cpp, with the gguf package.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from ..gguf_io import LAYERS_FILE
from ..storage import int8_rows
from .checkpoint import EpochCheckpoint, cosine_schedule, train_epochs


def _hf_target_dir(target: str) -> Path:
    from ..backends.transformers import convert_gguf
    from ..models import resolve

    src = resolve(target)
    if src.kind != "gguf":
        return Path(src.location)
    return convert_gguf(src.location, progress=True)


def build_draft(target: str, n_layers: int, intermediate: int | None = None):
    """A draft ``LlamaForCausalLM`` initialized from the target's layers (evenly spaced) and its embeddings."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

    folder = _hf_target_dir(target)
    tcfg = AutoConfig.from_pretrained(folder)
    if tcfg.model_type != "llama":
        raise ValueError(f"draft-model training supports llama-architecture targets; {target} is {tcfg.model_type} "
                         f"(train an eagle or medusa head instead)")
    cfg = AutoConfig.from_pretrained(folder)
    cfg.num_hidden_layers = int(n_layers)
    if intermediate:
        cfg.intermediate_size = int(intermediate)
    draft = LlamaForCausalLM(cfg)
    tgt = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    picks = np.linspace(0, tcfg.num_hidden_layers - 1, num=n_layers).round().astype(int).tolist()
    sd_t = tgt.state_dict()
    sd_d = draft.state_dict()
    with torch.no_grad():
        for name in sd_d:
            if name.startswith("model.layers."):
                parts = name.split(".")
                src_name = ".".join(parts[:2] + [str(picks[int(parts[2])])] + parts[3:])
                w = sd_t[src_name]
                d = sd_d[name]
                if w.shape != d.shape:  # a narrower MLP: keep the first neurons
                    w = w[tuple(slice(0, s) for s in d.shape)]
                d.copy_(w)
            elif name in sd_t:
                sd_d[name].copy_(sd_t[name])
    draft.load_state_dict(sd_d)
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft, picks


def non_embedding_parameters(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)


def train_draft_model(target: str, out_dir: Path, n_layers: int, examples: list[dict], epochs: int = 2,
                      lr: float = 5e-4, batch_size: int = 8, intermediate: int | None = None, progress: bool = True,
                      max_len: int = 384, device: str | None = None) -> dict:
    """Distill a draft model on ``device`` (None: cpu); checkpoint per epoch; returns training metrics
    (the model is returned on the CPU)."""
    import torch
    import torch.nn.functional as F

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    draft, picks = build_draft(target, n_layers, intermediate)
    dev = torch.device(device or "cpu")
    draft.to(dev)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    steps = math.ceil(len(examples) / batch_size) * epochs
    sched = cosine_schedule(opt, steps, warmup_steps=30)
    checkpoint = EpochCheckpoint(out_dir, draft, opt, sched)
    E = draft.model.embed_tokens.weight

    def batch_loss(batch):
        T = min(max_len, max(len(e["tokens"]) for e in batch))
        ids = torch.zeros((len(batch), T), dtype=torch.long)
        attn = torch.zeros((len(batch), T), dtype=torch.long)
        sel_b, sel_t, tk_ids, tk_p = [], [], [], []
        for b, e in enumerate(batch):
            toks = e["tokens"][-T:]
            off = len(e["tokens"]) - len(toks)
            ids[b, : len(toks)] = torch.from_numpy(toks.astype(np.int64))
            attn[b, : len(toks)] = 1
            pl = e["prompt_len"]
            for i in range(len(e["lse"])):
                pos = pl - 1 + i - off  # position whose next token is output i
                if 0 <= pos < len(toks):
                    sel_b.append(b)
                    sel_t.append(pos)
                    tk_ids.append(e["topk_ids"][i])
                    tk_p.append(np.exp(e["topk_vals"][i].astype(np.float32) - e["lse"][i]))
        h = draft.model(input_ids=ids.to(dev), attention_mask=attn.to(dev)).last_hidden_state
        hs = h[torch.tensor(sel_b, device=dev), torch.tensor(sel_t, device=dev)]
        logq = F.log_softmax(hs @ E.T, dim=-1)
        tid = torch.from_numpy(np.asarray(tk_ids, dtype=np.int64)).to(dev)
        tp = torch.from_numpy(np.asarray(tk_p, dtype=np.float32)).to(dev)
        tp = tp / tp.sum(-1, keepdim=True)
        loss = -(tp * logq.gather(1, tid)).sum(-1).mean()
        top1 = (logq.argmax(-1) == tid[torch.arange(len(tid), device=dev), tp.argmax(-1)]).float().mean().item()
        return loss, top1

    def batches(epoch):
        order = np.random.default_rng(epoch).permutation(len(examples))
        return [[examples[j] for j in order[i : i + batch_size]] for i in range(0, len(order), batch_size)]

    t0 = time.time()
    history = train_epochs(draft, checkpoint, epochs, batches, batch_loss, params, opt, sched,
                           f"train draft-model ({n_layers} layers)", progress)
    draft.eval()
    draft.to("cpu")
    return {"model": draft, "picks": picks, "history": history, "train_seconds": time.time() - t0,
            "non_embedding_parameters": non_embedding_parameters(draft)}


# ---- storage (read back by speculative.gguf_io) ---------------------------------------------------------------------------


def save_layers(draft, folder: Path, target: str, target_gguf: str) -> None:
    """The shipped form: decoder layers and final norm (int8 per row), no embeddings."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in draft.state_dict().items():
        if "embed_tokens" in name or "lm_head" in name:
            continue
        for suffix, part in int8_rows(t).items():
            tensors[name + suffix] = part
    save_file(tensors, str(folder / LAYERS_FILE))
    cfg = draft.config
    (folder / "drafter.json").write_text(json.dumps({
        "method": "draft-model", "target": target, "target_gguf_name": Path(target_gguf).name,
        "num_hidden_layers": cfg.num_hidden_layers, "intermediate_size": cfg.intermediate_size,
        "hidden_size": cfg.hidden_size, "non_embedding_parameters": non_embedding_parameters(draft),
    }, indent=1))
