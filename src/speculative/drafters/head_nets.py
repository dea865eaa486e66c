"""The networks of draft heads that read the target's hidden states (PyTorch): EAGLE-style and Medusa,
their incremental KV cache, and their storage (``drafter.json`` + ``head.safetensors``).

Inference (:mod:`speculative.drafters.heads`) and the checkpoint importer use them;
:mod:`speculative.training.train` trains them.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking
Feature Uncertainty", section 4): a single decoder layer that, at position t,
reads the target's feature f_t (the final hidden state, which the target's LM
head maps to the distribution of token t+1) and the embedding of token t+1,
and predicts the feature f_{t+1}; the target's LM head turns it into the
distribution of token t+2. Drafting is autoregressive in feature space. Here
the layer attends to a sliding window of its own past inputs (``window``
positions), so a drafter needs the target's features of only the last
``window`` prompt tokens.

Medusa (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework
with Multiple Decoding Heads", section 2.1.1): K residual blocks on f_t; head k
predicts token t+k+1 (token t+1 being the target's own prediction).

Both use a reduced draft vocabulary (FR-Spec, Zhao et al. 2025): the output
rows of the target's LM head for the most frequent output tokens, frozen.
Input embeddings and LM-head rows come from the target's own weights at load
time and are not stored with the head.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..storage import dequantize_rows, int8_rows
from .base import HEAD_PRECISIONS

HEAD_FILE = "head.safetensors"
CONFIG_FILE = "drafter.json"


@dataclass
class HeadConfig:
    """Architecture of a draft head.

    Attributes:
        method: "eagle", "eagle3" or "medusa".
        hidden_size: the target's hidden size H (the features' width).
        vocab_ids: target token ids of the reduced draft vocabulary (most frequent first).
        n_heads, n_kv_heads, head_dim, intermediate_size, window, rope_theta: the EAGLE layer.
        medusa_heads: K, the number of Medusa heads.
        aux_layers: EAGLE-3: the target layers whose hidden states are fused (Hugging Face
            ``hidden_states`` indices); empty means EAGLE-3's default (2, L // 2, L - 3).
        target_hidden_size: EAGLE-3: the target's hidden size when it differs from the head's.
        norm_before_residual: EAGLE-3: the fused feature is normalized before the residual branch.
        target: the target this head was trained for (registry name or file name).
        target_vocab_size: the target's vocabulary size.
    """

    method: str
    hidden_size: int
    vocab_ids: list[int] = field(default_factory=list)
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1024
    window: int = 32
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    medusa_heads: int = 3
    fc_bias: bool = True
    aux_layers: list[int] = field(default_factory=list)  # EAGLE-3: target layers read ([] = 2, L//2, L-3)
    target_hidden_size: int = 0  # EAGLE-3: width of each target layer's hidden state (0: hidden_size)
    norm_before_residual: bool = False  # EAGLE-3 (speculators option)
    target: str = ""
    target_vocab_size: int = 0
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> HeadConfig:
        """Parse and check a ``drafter.json``.

        Raises:
            ValueError: not JSON, not an object, or a field of the wrong type or range (named).
        """
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d) -> HeadConfig:
        """A checked config from a parsed ``drafter.json`` (unknown keys ignored).

        Raises:
            ValueError: not an object, or a field of the wrong type or range (named).
        """
        if not isinstance(d, dict):
            raise ValueError(f"a JSON object was expected, found {type(d).__name__}")
        cfg = cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        cfg.check()
        return cfg

    def check(self) -> None:
        """Raise ValueError naming the first field whose type or range is wrong."""
        def ints(name, values, low):
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= low for v in values):
                raise ValueError(f"'{name}' must hold integers >= {low}")

        if self.method not in ("eagle", "eagle3", "medusa"):
            raise ValueError(f"'method' is {json.dumps(self.method)}, not a head (eagle, eagle3, medusa)")
        for name in ("hidden_size", "n_heads", "n_kv_heads", "head_dim", "intermediate_size", "window", "medusa_heads"):
            ints(name, [getattr(self, name)], 1)
        for name in ("target_hidden_size", "target_vocab_size"):
            ints(name, [getattr(self, name)], 0)
        for name in ("vocab_ids", "aux_layers"):
            if not isinstance(getattr(self, name), list):
                raise ValueError(f"'{name}' must be a list")
            ints(name, getattr(self, name), 0)
        if self.target_vocab_size and self.vocab_ids and max(self.vocab_ids) >= self.target_vocab_size:
            raise ValueError(f"'vocab_ids' holds {max(self.vocab_ids)}, beyond the target's {self.target_vocab_size:,} "
                             "tokens ('target_vocab_size')")
        for name in ("rope_theta", "norm_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"'{name}' must be a positive number")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("'n_heads' must be a multiple of 'n_kv_heads'")
        if not isinstance(self.extra, dict):
            raise ValueError("'extra' must be an object")
        n = self.extra.get("draft_vocab", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"'extra.draft_vocab' must be an integer >= 1, got {json.dumps(n)}")
        precision = self.extra.get("inference_precision", "fp32")
        if precision not in HEAD_PRECISIONS:
            raise ValueError(f"'extra.inference_precision' must be \"int8\" or \"fp32\", got {json.dumps(precision)}")


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x`` [..., T, D] at integer positions ``pos`` [T] (half-split convention)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class TargetWeights:
    """The target's input embeddings (full vocabulary) and LM-head rows of the draft vocabulary, frozen."""

    def __init__(self, embed: np.ndarray, lm_head_rows: np.ndarray, device="cpu", dtype=torch.float32):
        self.embed = torch.from_numpy(np.ascontiguousarray(embed)).to(device=device)  # [V, H] (fp16 to save memory)
        self.lm_head = torch.from_numpy(np.ascontiguousarray(lm_head_rows)).to(device=device, dtype=dtype)  # [Vr, H]
        self.dtype = dtype

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed[ids].to(self.dtype)


class _DecoderLayer(nn.Module):
    """What EAGLE and EAGLE-3 heads share: rotary attention over a sliding window of ``cfg.window``
    positions (with an incremental :class:`HeadCache`), and the residual MLP block. Subclasses
    define q/k/v/o_proj, post_norm, gate/up/down and ``drop``."""

    def _qkv(self, x, pos):
        c = self.cfg
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        return _rope(q, pos, c.rope_theta), _rope(k, pos, c.rope_theta), v

    def _attend(self, q, k, v, mask):
        rep = self.cfg.n_heads // self.cfg.n_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        B, _, T, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def _block(self, x, attn_out):
        h = x + self.drop(attn_out)
        n = self.post_norm(h)
        return h + self.drop(self.down(F.silu(self.gate(n)) * self.up(n)))

    def _attend_cached(self, x, cache: HeadCache):
        """Self-attention output [1, n, H] of n new inputs x [1, n, D], appended to ``cache``."""
        n = x.shape[1]
        pos = torch.arange(cache.length, cache.length + n, device=x.device)
        q, k, v = self._qkv(x, pos)
        cache.append(k, v)
        K, V, kpos = cache.window_kv(self.cfg.window + n)
        mask = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - self.cfg.window)
        return self._attend(q, K, V, mask)


class EagleHead(_DecoderLayer):
    """One decoder layer over (feature, next-token embedding) pairs, predicting the next feature."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h, nh, nkv, hd = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        # EAGLE-1 / speculators "eagle" layout: fusion fc, then a decoder layer without input norm
        self.fc = nn.Linear(2 * h, h, bias=cfg.fc_bias)
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.post_norm = RMSNorm(h, cfg.norm_eps)
        self.gate = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)
        nn.init.zeros_(self.o_proj.weight)
        nn.init.zeros_(self.down.weight)
        self.drop = nn.Dropout(0.0)  # training only; no parameters, so checkpoints are unaffected

    def set_dropout(self, p: float) -> None:
        self.drop.p = float(p)

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        """Training: features [B, T, H] and embeddings of the next tokens [B, T, H] -> predicted next features.

        The fusion input is [features, embeddings] (EAGLE's original order is embeddings first;
        :mod:`speculative.interchange` swaps the halves of ``fc`` on export and import)."""
        B, T, _ = features.shape
        x = self.fc(torch.cat([features, next_embeds], dim=-1))
        pos = torch.arange(T, device=x.device)
        q, k, v = self._qkv(x, pos)
        i = pos[:, None]
        j = pos[None, :]
        mask = (j <= i) & (j > i - self.cfg.window)
        return self._block(x, self._attend(q, k, v, mask))

    def forward_unrolled(self, features: torch.Tensor, next_embeds: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test (EAGLE-3, Li et al. 2025, section 3.2): the outputs [B, T, H] of ``steps`` >= 1
        drafting steps, from features [B, T, H] (the target's) and next-token embeddings [B, T, H].

        Step 1 is :meth:`forward`. At step s > 1 the input feature of position j is the head's own output at
        position j - 1 from step s - 1, as when it drafts its s-th token, and position j attends to what the
        drafting cache then holds: the step-1 keys and values (inputs from the target's features) up to
        position j - s + 1, and, for r = 2 .. s, step r's at position j - (s - r) (the chain of the head's
        own predictions leading to j). Positions j < s - 1, whose chains would start before the window, keep
        the target's feature at position 0 as :meth:`forward`'s unrolling does.
        """
        B, T, _ = features.shape
        pos = torch.arange(T, device=features.device)
        i, j = pos[:, None], pos[None, :]
        outs, ks, vs, prev = [], [], [], None
        for s in range(1, steps + 1):
            feats = features if prev is None else torch.cat([features[:, :1], prev[:, :-1]], dim=1)
            x = self.fc(torch.cat([feats, next_embeds], dim=-1))
            q, k, v = self._qkv(x, pos)
            ks.append(k)
            vs.append(v)
            blocks = [(j <= i - (s - 1)) & (j > i - self.cfg.window)]  # step 1: the target-fed context
            blocks += [j == i - (s - r) for r in range(2, s + 1)]  # the chain's own earlier steps
            mask = torch.cat(blocks, dim=1)  # [T, s * T]
            prev = self._block(x, self._attend(q, torch.cat(ks, dim=2), torch.cat(vs, dim=2), mask))
            outs.append(prev)
        return outs

    # ---- incremental use (drafting) ----------------------------------------------------------

    def step(self, features: torch.Tensor, next_embeds: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """Append n (feature, next embedding) pairs [n, H] to ``cache``; returns their outputs [n, H]."""
        x = self.fc(torch.cat([features, next_embeds], dim=-1))[None]  # [1, n, H]
        return self._block(x, self._attend_cached(x, cache))[0]


class Eagle3Head(_DecoderLayer):
    """EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language
    Models via Training-Time Test", section 3): ``fc`` fuses the target's hidden states of three
    layers ([n, 3 * Ht] -> [n, H]); one decoder layer reads [norm(embedding), norm(feature)]
    (2H wide) with a residual on the feature; its own LM head (final norm, then [Vd, H]) predicts
    over the draft vocabulary. Later draft steps feed the layer's own output back as the feature
    (H wide, no ``fc``). Inference only here: checkpoints are imported, not trained."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h, nh, nkv, hd = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        ht = cfg.target_hidden_size or h
        self.fc = nn.Linear(3 * ht, h, bias=cfg.fc_bias)
        self.hidden_norm = RMSNorm(h, cfg.norm_eps)
        self.input_norm = RMSNorm(h, cfg.norm_eps)
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.post_norm = RMSNorm(h, cfg.norm_eps)
        self.gate = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h, cfg.norm_eps)
        self.lm_head = nn.Linear(h, len(cfg.vocab_ids), bias=False)
        self.drop = nn.Identity()  # inference only

    def step(self, features: torch.Tensor, next_embeds: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """Append n (feature, next embedding) pairs to ``cache``; features are the target's fused
        layers [n, 3 * Ht] or the head's own outputs [n, H]. Returns the outputs [n, H] (before the
        final norm; :meth:`logits` maps them to the draft vocabulary)."""
        if features.shape[-1] != self.cfg.hidden_size:
            features = self.fc(features)
        if self.cfg.norm_before_residual:
            features = self.hidden_norm(features)
            hid = features
        else:
            hid = self.hidden_norm(features)
        x = torch.cat([self.input_norm(next_embeds), hid], dim=-1)[None]  # [1, n, 2H]
        return self._block(features[None], self._attend_cached(x, cache))[0]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., Vd] of outputs [..., H]."""
        return self.lm_head(self.norm(out))


class HeadCache:
    """Keys/values of an EAGLE head's past inputs, with rollback (rows are positions)."""

    def __init__(self):
        self.k: torch.Tensor | None = None  # [1, nkv, T, hd]
        self.v: torch.Tensor | None = None
        self.length = 0

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.length += k.shape[2]

    def window_kv(self, n: int):
        start = max(0, self.length - n)
        pos = torch.arange(start, self.length, device=self.k.device)
        return self.k[:, :, start:], self.v[:, :, start:], pos

    def truncate(self, n: int) -> None:
        if n < self.length:
            self.k = self.k[:, :, :n]
            self.v = self.v[:, :, :n]
            self.length = n


class MedusaHeads(nn.Module):
    """K residual blocks on the target's feature; block k feeds the frozen LM-head rows to predict token t+k+1."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.blocks = nn.ModuleList([nn.Linear(h, h) for _ in range(cfg.medusa_heads)])
        for b in self.blocks:
            nn.init.zeros_(b.weight)
            nn.init.zeros_(b.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., H] -> per-head features [K, ..., H] (residual blocks, Medusa-1)."""
        return torch.stack([features + F.silu(b(features)) for b in self.blocks])


def build_head(cfg: HeadConfig) -> nn.Module:
    if cfg.method == "eagle":
        return EagleHead(cfg)
    if cfg.method == "eagle3":
        return Eagle3Head(cfg)
    if cfg.method == "medusa":
        return MedusaHeads(cfg)
    raise ValueError(f"unknown head method {cfg.method!r}")


# ---- storage ----------------------------------------------------------------------------------


def save_head(head: nn.Module, cfg: HeadConfig, folder: Path, int8: bool = True) -> None:
    """Write ``drafter.json`` and ``head.safetensors`` (int8 per-row weights + fp32 scales when ``int8``).

    Raises:
        ConfigError: ``cfg`` fails :meth:`HeadConfig.check` (what :func:`load_head` would refuse is not written).
    """
    from safetensors.torch import save_file

    from ..errors import ConfigError

    try:
        cfg.check()
    except ValueError as e:
        raise ConfigError(f"{folder / CONFIG_FILE}: not written, {e}") from None
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in head.state_dict().items():
        for suffix, part in (int8_rows(t, min_numel=4096) if int8 else {"": t.detach().float().cpu()}).items():
            tensors[name + suffix] = part.contiguous()
    save_file(tensors, str(folder / HEAD_FILE))
    (folder / CONFIG_FILE).write_text(cfg.to_json())


def load_head(folder: Path, device="cpu") -> tuple[nn.Module, HeadConfig]:
    from safetensors.torch import load_file

    from ..errors import ConfigError

    try:
        cfg = HeadConfig.from_json((folder / CONFIG_FILE).read_text())
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{folder / CONFIG_FILE}: not a drafter description ({e})") from None
    try:
        state = dequantize_rows(load_file(str(folder / HEAD_FILE)))
    except FileNotFoundError:
        raise ConfigError(f"{folder / HEAD_FILE}: missing (the head's weights)") from None
    except Exception:  # safetensors raises its own error types for damaged files
        raise ConfigError(f"{folder / HEAD_FILE}: corrupt or truncated (not a readable safetensors file)") from None
    head = build_head(cfg)
    try:
        head.load_state_dict(state)
    except RuntimeError:
        raise ConfigError(f"{folder / HEAD_FILE}: its weights do not fit the head {folder / CONFIG_FILE} "
                          "describes (another configuration or target)") from None
    head.eval().to(device)
    return head, cfg
