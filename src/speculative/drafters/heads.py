"""Drafters built on draft heads that read the target's hidden states: EAGLE-style and Medusa.

Both run in PyTorch beside either backend: the engine hands them the target's
final hidden state of every committed token (llama.cpp returns it with the
logits of the same decode; transformers returns it from the same forward).

* ``eagle:NAME_OR_PATH`` drafts autoregressively in feature space (Li et al.
  2024). With ``tree=B`` it proposes a token tree: the top-1 chain, plus the
  next B-1 candidates at every depth as siblings (the shape EAGLE-2's dynamic
  trees take for confident drafts, and the one llama.cpp's exact numerics
  verify fully).
* ``medusa:NAME_OR_PATH`` proposes a static tree from K heads' top candidates
  (Cai et al. 2024); ``tree=0`` proposes their top-1 chain.

The draft vocabulary is reduced (FR-Spec, Zhao et al. 2025); verification stays
on the full vocabulary, so output is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError, VocabularyMismatchError
from .base import HEAD_PRECISIONS, DraftProposal, DraftState, Drafter
from .calibration import AcceptanceCalibration, ShadowScorer, TenantCalibrations, confidence_bucket, confidence_scorer


class _TreeBuilder:
    """Grows a draft along its top-1 path (the spine); with ``width`` > 1 every spine node also gets
    its ``width`` - 1 runner-up siblings. Confidence of a spine token is the calibrated acceptance of
    its (probability, depth) bucket; a sibling's is its probability times its spine sibling's."""

    def __init__(self, cal: AcceptanceCalibration, width: int):
        self.cal, self.width = cal, max(1, width)
        self.tokens, self.conf, self.parents, self.buckets, self.spine = [], [], [], [], []
        self.parent = -1

    def add_level(self, probs, vocab_ids, depth: int) -> float:
        """Add one depth from ``probs`` ([Vr] float tensor over the draft vocabulary); returns the spine
        node's confidence."""
        import torch

        top = torch.topk(probs, self.width)
        ids = [int(vocab_ids[i]) for i in top.indices.tolist()]
        vals = top.values.tolist()
        spine_conf = self.cal.estimate(confidence_bucket(vals[0], depth))
        spine_node = len(self.tokens)
        for rank, (tok, q) in enumerate(zip(ids, vals)):
            self.tokens.append(tok)
            self.conf.append(spine_conf if rank == 0 else q * spine_conf)
            self.parents.append(self.parent)
        self.buckets.append(confidence_bucket(vals[0], depth))
        self.spine.append(ids[0])
        self.parent = spine_node
        return spine_conf

    @property
    def spine_token(self) -> int:
        return self.tokens[self.parent]

    def proposal(self, scorer, context_len: int, tree: bool) -> DraftProposal:
        scorer.record(context_len, self.spine, self.buckets)
        if not tree:
            return DraftProposal(tokens=self.tokens, confidence=self.conf)
        return DraftProposal(tokens=self.tokens, confidence=self.conf, parents=self.parents)


def target_weights_for(backend, vocab_ids, device="cpu"):
    """The target's input embeddings and LM-head rows of ``vocab_ids``, from its own weights."""
    from .head_nets import TargetWeights

    embed, head = target_embedding_matrices(backend)
    return TargetWeights(embed, np.asarray(head[np.asarray(vocab_ids)], dtype=np.float32), device=device)


def target_embedding_matrices(backend) -> tuple[np.ndarray, np.ndarray]:
    """(input embeddings [V, H] float16, output head [V, H]) of a loaded target."""
    cached = getattr(backend, "_embedding_matrices", None)
    if cached is not None:
        return cached
    if backend.name == "llama.cpp":
        from gguf import GGUFReader
        from gguf.quants import dequantize

        r = GGUFReader(str(backend.path))
        tensors = {t.name: t for t in r.tensors}
        emb = dequantize(tensors["token_embd.weight"].data, tensors["token_embd.weight"].tensor_type).astype(np.float16)
        if "output.weight" in tensors:
            head = dequantize(tensors["output.weight"].data, tensors["output.weight"].tensor_type).astype(np.float16)
        else:
            head = emb
    else:
        emb = backend.model.get_input_embeddings().weight.detach().float().cpu().numpy().astype(np.float16)
        head = backend.model.get_output_embeddings().weight.detach().float().cpu().numpy().astype(np.float16)
    backend._embedding_matrices = (emb, head)
    return emb, head


@dataclass
class HeadState(DraftState):
    feats: dict[int, np.ndarray] = field(default_factory=dict)  # position -> target hidden state
    cache: object = None  # HeadCache (EAGLE)
    pairs: list[int] = field(default_factory=list)  # context tokens fed into the cache as pair inputs
    first: int = 0  # position of the first pair in the cache
    scorer: ShadowScorer = field(default_factory=ShadowScorer)


def int8_available() -> bool:
    """Whether PyTorch here has the x86 quantized engine (x86 or fbgemm) that :func:`int8_linears` uses; without
    it a head asked to run int8 runs fp32."""
    import torch

    return any(e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm"))


def int8_linears(module):
    """``module`` with every ``nn.Linear`` replaced by PyTorch's dynamically quantized int8 Linear
    (weights int8 with one scale per output row, activations quantized per call; fbgemm/x86 kernels): a quarter of the
    bytes read per draft token, which is what a head's CPU cost is. Returns ``module`` unchanged where
    the PyTorch build has no quantized engine. The head's outputs change by the quantization error only,
    which moves what it proposes, never what verification accepts."""
    import warnings

    import torch
    from torch import nn

    if not int8_available():
        return module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager-mode quantization is deprecated in favour of torchao, still supported
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig  # one scale per output row
        return torch.ao.quantization.quantize_dynamic(module, {nn.Linear: qconfig}, dtype=torch.qint8)


class _HeadDrafter(Drafter):
    needs_hidden = True
    runs_network = True

    def __init__(self, folder: str | Path, tree: int = 0, device: str = "cpu", precision: str | None = "fp32",
                 draft_vocab: int | None = None):
        super().__init__()
        import torch

        from .head_nets import load_head

        self.calibrations = TenantCalibrations()  # kept across requests, per tenant

        self.folder = Path(folder)
        if not (self.folder / "drafter.json").is_file():
            raise ConfigError(f"{folder} is not a trained drafter folder (no drafter.json)")
        self.head, self.cfg = load_head(self.folder, device)
        if precision is None:  # the head's own recommendation (drafter.json "extra"), fp32 if none
            precision = str(self.cfg.extra.get("inference_precision", "fp32"))
        if precision not in HEAD_PRECISIONS:
            raise ConfigError(f"precision must be int8 or fp32, got {precision!r}")
        # int8 where it runs: on the CPU, with a quantized engine in this PyTorch (else the head stays fp32)
        self.int8 = precision == "int8" and str(device) == "cpu" and int8_available()
        if self.int8:
            self.head = int8_linears(self.head)
        self._lm_head = None  # int8: the draft vocabulary's LM-head rows as a quantized Linear
        self.device = device
        self.tree = int(tree)
        self.vocab_ids = np.asarray(self.cfg.vocab_ids, dtype=np.int64)
        if draft_vocab is None:  # the head's own recommendation (drafter.json "extra"), all of it if none
            draft_vocab = self.cfg.extra.get("draft_vocab")
        if draft_vocab is not None:  # the N most frequent tokens (vocab_ids lists them most frequent first)
            if self.cfg.method != "eagle":  # EAGLE-3 and imported Medusa heads carry LM heads of their own
                raise ConfigError(f"{self.folder / 'drafter.json'}: a draft vocabulary size (extra.draft_vocab) "
                                  f"applies to EAGLE heads only, not {self.cfg.method}")
            if draft_vocab < 1:
                raise ConfigError(f"draft vocabulary size must be >= 1, got {draft_vocab}")
            self.vocab_ids = self.vocab_ids[:draft_vocab]
        self._torch = torch
        self._threads_before: int | None = None
        self._warm = False
        self.weights = None

    def bind(self, target) -> None:
        if self.cfg.target_vocab_size and target.vocab_size != self.cfg.target_vocab_size:
            raise VocabularyMismatchError(
                f"drafter {self.folder.name} was trained for a {self.cfg.target_vocab_size:,}-token vocabulary "
                f"({self.cfg.target}); target {target.model_id} has {target.vocab_size:,}"
            )
        if self.cfg.hidden_size != target.hidden_size:
            raise ConfigError(
                f"drafter {self.folder.name} reads {self.cfg.hidden_size}-wide hidden states; "
                f"target {target.model_id} has {target.hidden_size}"
            )
        if self.vocab_ids.size and int(self.vocab_ids.max()) >= target.vocab_size:
            raise VocabularyMismatchError(
                f"{self.folder / 'drafter.json'}: its draft vocabulary holds token {int(self.vocab_ids.max()):,}; "
                f"target {target.model_id} has {target.vocab_size:,} tokens"
            )
        self.weights = target_weights_for(target, self.vocab_ids, self.device)
        if self.int8:
            from torch import nn

            lin = nn.Linear(self.weights.lm_head.shape[1], self.weights.lm_head.shape[0], bias=False)
            lin.weight.data = self.weights.lm_head
            self._lm_head = int8_linears(nn.Sequential(lin))
        super().bind(target)

    def observe_hidden(self, state: HeadState, start: int, hidden) -> None:
        for i, row in enumerate(np.asarray(hidden, dtype=np.float32)):
            if np.isfinite(row).all():  # a non-finite row counts as missing (the head then re-syncs)
                state.feats[start + i] = row
            else:
                state.feats.pop(start + i, None)
        # forget features the window can no longer reach
        if len(state.feats) > 4 * self.hidden_window + 64:
            horizon = max(state.feats) - 2 * self.hidden_window - 32
            for p in [p for p in state.feats if p < horizon]:
                del state.feats[p]

    def _new_state(self, prompt_len: int, scorer: ShadowScorer) -> HeadState:
        """A request's state for a prompt of ``prompt_len`` tokens whose outcomes ``scorer`` tallies."""
        return HeadState(prompt_len=prompt_len, scorer=scorer)

    def start(self, prompt, messages=None, tenant="") -> HeadState:
        return self._new_state(len(prompt), confidence_scorer(self.calibrations.get(tenant)))

    @property
    def feature_width(self) -> int:
        """Floats per position in the features :meth:`observe_hidden` gets (the target's hidden state)."""
        return self.cfg.hidden_size

    def warm_up(self) -> None:
        """One proposal through the real path (:meth:`propose`, so on the target's thread count, which it sets
        for PyTorch as every proposal does) on zero features: the prompt window's catch-up, then two draft
        tokens. Its state and calibration are thrown away (the tenants' calibrations are untouched). Once per
        drafter; nothing before :meth:`bind`."""
        if self.target is None or self._warm:
            return
        self._warm = True
        n = max(1, self.hidden_window)
        state = self._new_state(n, confidence_scorer())
        zero = np.zeros(self.feature_width, dtype=np.float32)
        state.feats = {j: zero for j in range(n)}
        self.propose(state, [0] * (n + 1), 2, None, None)

    def _probs(self, logits):
        p = self._torch.softmax(logits.float(), dim=-1)
        return p

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None) -> DraftProposal:
        """Run the head (greedy top-B candidates: deterministic, so q is one-hot). Steps the policy skips
        cost nothing: the head catches up on the target's hidden states in one batch at the next proposal.
        Not steerable: ``guide`` is ignored (the request cuts the draft where the constraint refuses)."""
        self._follow_target_threads()
        with self._torch.inference_mode():
            return self._propose(state, context, max_tokens, sampler, rng, min_confidence)

    def _follow_target_threads(self) -> None:
        """Run the head's PyTorch work on as many threads as the target's forwards use now (llama.cpp's thread
        governor drops to fewer while other processes hold cores, or the user's ``--threads``); :meth:`close`
        restores the count it found. The setting is PyTorch's intra-op count for the process. PyTorch would
        otherwise keep one thread per core: on a 2-core machine with one core busy its threads then wait at every
        barrier for a scheduler slice (SmolLM2's head: 20.2 ms per draft token against 2.6 with one thread;
        docs/policy.md, "Threads")."""
        if self.target is None or str(self.device) != "cpu":
            return
        n = self.target.cpu_threads_now()
        if n and self._torch.get_num_threads() != n:
            if self._threads_before is None:
                self._threads_before = self._torch.get_num_threads()  # restored by close()
            self._torch.set_num_threads(n)

    def finish(self, state, context=None) -> None:
        if context is not None:
            state.scorer.score(context)  # the last proposal's outcome, for the calibration the drafter keeps
        state.feats.clear()

    def close(self) -> None:
        if self._threads_before is not None:  # the process's PyTorch thread count as it was before drafting
            self._torch.set_num_threads(self._threads_before)
            self._threads_before = None
        super().close()

    def non_embedding_parameters(self) -> int:
        """The head's own weights (its LM-head rows are the target's): float parameters, plus the weights and
        biases of int8 layers, which PyTorch keeps packed outside ``parameters()``."""
        packed = 0
        for m in self.head.modules():
            if callable(getattr(m, "weight", None)):
                bias = m.bias() if callable(getattr(m, "bias", None)) else None
                packed += m.weight().numel() + (bias.numel() if bias is not None else 0)
        return int(sum(p.numel() for p in self.head.parameters()) + packed)


class EagleDrafter(_HeadDrafter):
    """``eagle:NAME_OR_PATH[,tree=B]``: an EAGLE-style head (one decoder layer over target features)."""

    kind = "eagle"

    def __init__(self, folder, tree: int = 0, device: str = "cpu", precision: str | None = None,
                 draft_vocab: int | None = None):
        super().__init__(folder, tree, device, precision, draft_vocab)
        if self.cfg.method != self.kind:
            hint = " (use the eagle3: drafter)" if self.cfg.method == "eagle3" else ""
            raise ConfigError(f"{folder} holds a drafter of kind '{self.cfg.method}', not {self.kind}{hint}")
        self.hidden_window = self.cfg.window

    @property
    def description(self) -> str:
        """The drafter as a spec that names what runs: e.g. ``eagle:NAME,precision=int8,vocab=8192,tree=3``
        (the precision and draft-vocabulary size in use, whether chosen or recommended by the head)."""
        opts = ["precision=" + ("int8" if self.int8 else "fp32")]
        if self.cfg.method == "eagle":
            opts.append(f"vocab={self.vocab_ids.size}")
        if self.tree:
            opts.append(f"tree={self.tree}")
        return f"{self.kind}:{self.folder.name}," + ",".join(opts)

    def _logits(self, out):
        """Draft-vocabulary logits of head outputs [..., H] (the target's own LM-head rows)."""
        if self._lm_head is not None:
            return self._lm_head(out) if out.dim() > 1 else self._lm_head(out[None])[0]
        return out @ self.weights.lm_head.T

    def _new_state(self, prompt_len: int, scorer: ShadowScorer) -> HeadState:
        from .head_nets import HeadCache

        return HeadState(prompt_len=prompt_len, cache=HeadCache(), scorer=scorer,
                         first=max(0, prompt_len - self.hidden_window))

    def _sync(self, st: HeadState, context) -> object:
        """Feed the true (feature, next token) pairs up to the last committed token; return the last output."""
        torch = self._torch
        st.cache.truncate(len(st.pairs))  # drop the pairs of the last draft (they used predicted features)
        # keep the true pairs that still agree with the context
        n_ok = 0
        while n_ok < len(st.pairs) and st.first + n_ok + 1 < len(context) and st.pairs[n_ok] == context[st.first + n_ok + 1]:
            n_ok += 1
        if n_ok < len(st.pairs):
            st.cache.truncate(n_ok)
            del st.pairs[n_ok:]
        # the window slides: restart from the last window of positions when the gap is too large
        last = len(context) - 2  # the last fed position (its feature is known)
        if last - (st.first + len(st.pairs)) > self.hidden_window or (st.first + len(st.pairs)) < last - 4 * self.hidden_window:
            from .head_nets import HeadCache

            st.cache = HeadCache()
            st.pairs = []
            st.first = max(min(st.feats), last - self.hidden_window + 1)
        js = [j for j in range(st.first + len(st.pairs), last + 1) if j in st.feats]
        if not js or js != list(range(js[0], last + 1)):
            return None  # features missing (should not happen)
        f = torch.from_numpy(np.stack([st.feats[j] for j in js])).to(self.device)  # the head's device (CUDA too)
        toks = torch.tensor([int(context[j + 1]) for j in js])
        out = self.head.step(f, self.weights.embed_tokens(toks), st.cache)
        st.pairs.extend(int(context[j + 1]) for j in js)
        return out[-1]

    def _propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0) -> DraftProposal:
        torch = self._torch
        state.scorer.score(context)
        feat = self._sync(state, context)
        if feat is None:
            return DraftProposal()
        tb = _TreeBuilder(state.scorer.calibration, self.tree)
        cum = 1.0
        for depth in range(max_tokens):
            probs = self._probs(self._logits(feat))
            if not bool(torch.isfinite(probs).all()):
                break  # a diverged prediction: propose what is drafted so far
            cum *= tb.add_level(probs, self.vocab_ids, depth)
            if depth + 1 >= max_tokens or not tb.cal.worth_drafting(cum, depth + 1, min_confidence):
                break
            tok = torch.tensor([tb.spine_token])
            feat = self.head.step(feat[None], self.weights.embed_tokens(tok), state.cache)[0]
        return tb.proposal(state.scorer, len(context), bool(self.tree))


class Eagle3Drafter(EagleDrafter):
    """``eagle3:PATH[,tree=B]``: an imported EAGLE-3 head (Li et al. 2025). It reads the target's
    hidden states of three layers (low, middle, high), so it needs a backend that returns
    intermediate layers (transformers); drafting, trees and rollback are as for ``eagle``."""

    kind = "eagle3"

    def bind(self, target) -> None:
        cfg = self.cfg
        if cfg.target_vocab_size and target.vocab_size != cfg.target_vocab_size:
            raise VocabularyMismatchError(
                f"EAGLE-3 head {self.folder.name} was trained for a {cfg.target_vocab_size:,}-token vocabulary; "
                f"target {target.model_id} has {target.vocab_size:,}"
            )
        if not target.supports_layer_hidden:
            raise ConfigError(
                f"EAGLE-3 head {self.folder.name} reads hidden states of three target layers; the {target.name} "
                "backend returns only the final one: use --backend transformers"
            )
        want_h = cfg.target_hidden_size or cfg.hidden_size
        if target.hidden_size != want_h:
            raise ConfigError(f"EAGLE-3 head {self.folder.name} reads {want_h}-wide hidden states; "
                              f"target {target.model_id} has {target.hidden_size}")
        n = target.num_layers
        layers = tuple(int(i) for i in cfg.aux_layers) or (2, n // 2, n - 3)
        if len(layers) != 3 or not all(0 <= i <= n for i in layers):
            raise ConfigError(f"EAGLE-3 head {self.folder.name} reads layers {list(layers)}; "
                              f"target {target.model_id} has {n} decoder layers")
        self.hidden_layers = layers
        self.weights = target_weights_for(target, self.vocab_ids[:1], self.device)  # input embeddings only
        Drafter.bind(self, target)

    @property
    def feature_width(self) -> int:
        """Floats per position: three target layers' hidden states, concatenated."""
        return 3 * (self.cfg.target_hidden_size or self.cfg.hidden_size)

    def _logits(self, out):
        return self.head.logits(out)


class MedusaDrafter(_HeadDrafter):
    """``medusa:NAME_OR_PATH[,tree=B]``: K Medusa heads; a chain of their top-1 tokens, or a tree with
    the top-B candidates of every head on the top-1 path."""

    kind = "medusa"
    hidden_window = 1

    def __init__(self, folder, tree: int = 0, device: str = "cpu"):
        super().__init__(folder, tree, device)
        if self.cfg.method != "medusa":
            raise ConfigError(f"{folder} holds a drafter of kind '{self.cfg.method}', not medusa")
        self.own_lm = None  # imported Medusa-1 heads carry their own LM heads [K, V, H]
        if (self.folder / "lm_heads.safetensors").is_file():
            from safetensors.torch import load_file

            self.own_lm = load_file(str(self.folder / "lm_heads.safetensors"))["lm_heads"].to(device)

    def bind(self, target) -> None:
        if self.own_lm is None:
            return super().bind(target)
        if self.cfg.hidden_size != target.hidden_size or self.own_lm.shape[1] != target.vocab_size:
            raise VocabularyMismatchError(
                f"Medusa heads {self.folder.name} ({self.own_lm.shape[1]:,} tokens, width {self.cfg.hidden_size}) "
                f"do not fit target {target.model_id} ({target.vocab_size:,} tokens, width {target.hidden_size})"
            )
        Drafter.bind(self, target)

    @property
    def description(self) -> str:
        return f"medusa:{self.folder.name}" + (f",tree={self.tree}" if self.tree else "")

    def _propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0) -> DraftProposal:
        torch = self._torch
        state.scorer.score(context)
        last = len(context) - 2
        if last not in state.feats:
            return DraftProposal()
        f = torch.from_numpy(state.feats[last]).to(self.device)
        heads = self.head(f)  # [K, H]
        if self.own_lm is not None:
            probs = self._probs(torch.einsum("kh,kvh->kv", heads, self.own_lm))
        else:
            probs = self._probs(heads @ self.weights.lm_head.T)  # [K, Vr]
        tb = _TreeBuilder(state.scorer.calibration, self.tree)
        for depth in range(min(max_tokens, probs.shape[0])):
            tb.add_level(probs[depth], self.vocab_ids, depth)
        return tb.proposal(state.scorer, len(context), bool(self.tree))
