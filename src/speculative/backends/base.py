"""The model-runner interface every backend implements.

A backend owns one loaded causal LM and the KV caches of up to
``max_sequences`` sequences. The engine and the drafters talk to it only
through :meth:`Backend.forward` (append tokens to sequences' caches, return
per-token logits and optionally final hidden states) and
:meth:`Backend.truncate` (roll a sequence's cache back to a prefix, without
recomputing anything).

What later work plugs into without a rewrite:
  * several sequences in one ``forward`` call (continuous batching in a server);
  * token trees: ``ForwardRequest.tree_parents`` gives each new token's parent,
    which a backend turns into per-token sequence ids (llama.cpp) or a 4-D
    attention mask with depth-based position ids (transformers);
  * per-token final hidden states next to the logits (draft heads such as
    EAGLE or Medusa read them): ``ForwardRequest.hidden``.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, ContextOverflowError
from ..trees import depths as tree_depths

#: Text of end-of-turn tokens that chat templates emit; a token with one of these
#: texts ends generation like EOS. Same list llama.cpp uses to build its
#: end-of-generation set (llama-vocab.cpp), so both backends agree.
END_OF_TURN_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<|return|>",
    "<|call|>",
)


@dataclass
class ForwardRequest:
    """Tokens to append to one sequence's cache, and what to return for them.

    Attributes:
        seq_id: the sequence (from :meth:`Backend.allocate_sequence`, 0 always exists).
        tokens: new token ids, placed at positions ``len(cache) + i`` (chains)
            or at depth-based positions (trees).
        logits: ``"all"``, ``"last"``, ``"none"`` or a list of row indices into
            ``tokens`` whose logits are returned, in that order.
        hidden: also return each returned row's final hidden state (after the
            final norm), as draft heads need.
        hidden_layers: with ``hidden``, return instead the hidden states of these
            layers concatenated, ``[n_out, len(hidden_layers) * H]`` (Hugging Face's
            ``hidden_states`` indices: 0 the embeddings, i the output of decoder
            layer i-1, which is the input of layer i), as EAGLE-3 heads read
            (Li et al. 2025, section 3.2). Backends without
            ``supports_layer_hidden`` raise :class:`NotImplementedError`.
        tree_parents: for a token tree, the parent of each new token as an index
            into ``tokens`` (-1: the last cached token). Parents come before
            children; a token sits at position ``len(cache) + depth - 1`` and
            attends to the cache and its ancestors only. None means a chain.
            After a tree forward, :meth:`Backend.commit_path` keeps one path.
            Backends without tree support raise :class:`NotImplementedError`
            (see ``Backend.supports_tree``).
    """

    seq_id: int
    tokens: Sequence[int]
    logits: str | Sequence[int] = "all"
    hidden: bool = False
    tree_parents: Sequence[int] | None = None
    hidden_layers: tuple[int, ...] | None = None

    def output_rows(self) -> list[int]:
        n = len(self.tokens)
        if isinstance(self.logits, str):
            if self.logits == "all":
                return list(range(n))
            if self.logits == "last":
                return [n - 1] if n else []
            if self.logits == "none":
                return []
            raise ValueError(f"logits must be 'all', 'last', 'none' or row indices, got {self.logits!r}")
        return [int(i) for i in self.logits]


@dataclass
class ForwardResult:
    """Outputs of one :class:`ForwardRequest`.

    Attributes:
        logits: float32 ``[n_out, V]``, one row per requested position, in the
            order requested. May be a view of backend memory that the next
            ``forward`` call overwrites: copy it to keep it.
        hidden: float32 ``[n_out, H]`` final hidden states, or None.
    """

    logits: np.ndarray
    hidden: np.ndarray | None = None


@dataclass
class _SequenceState:
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    tree: tuple[list[int], list[int]] | None = None  # (tokens, parents) of an uncommitted tree forward


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Backend(abc.ABC):
    """A loaded causal LM with per-sequence KV caches.

    Subclasses set ``name``, ``vocab_size``, ``n_ctx``, ``eos_token_ids``,
    ``max_sequences``, ``hidden_size``, call :meth:`_init_sequences`, and
    implement the abstract methods.
    """

    name: str = "backend"
    model_id: str = ""
    vocab_size: int = 0
    n_ctx: int = 0
    hidden_size: int = 0
    eos_token_ids: frozenset[int] = frozenset()
    max_sequences: int = 1
    supports_hidden: bool = True
    #: True when ``ForwardRequest.hidden_layers`` works (intermediate layers' hidden states)
    supports_layer_hidden: bool = False
    #: number of decoder layers (0: unknown)
    num_layers: int = 0
    supports_tree: bool = False
    #: True when only the spine of a token tree (the chain of first children, laid out
    #: first) gets logits bitwise equal to plain decoding's: the engine then verifies
    #: nothing past an off-spine node, which keeps greedy output identical.
    tree_spine_only: bool = False
    #: True when a position's logits do not depend on how many tokens share its
    #: forward pass, so greedy speculation reproduces plain greedy bit for bit.
    batch_invariant: bool = False
    #: seconds spent in forward passes so far (the model's own compute, for overhead accounting)
    forward_time_s: float = 0.0

    def __init__(self) -> None:
        self._seqs: dict[int, _SequenceState] = {}

    def _init_sequences(self) -> None:
        self._seqs = {s: _SequenceState() for s in range(self.max_sequences)}

    # ---- sequences and caches -------------------------------------------------

    def allocate_sequence(self, prompt: Sequence[int] = ()) -> int:
        """Take a free sequence, preferring the one whose cache shares the longest prefix with ``prompt``.

        The cache is kept as it is (call :meth:`reuse_prefix` to trim it), so a
        follow-up request of a multi-turn chat reuses its prefix's keys/values.

        Raises:
            ConfigError: all ``max_sequences`` sequences are in use.
        """
        best, best_len = None, -1
        for s, st in self._seqs.items():
            if st.busy:
                continue
            n = common_prefix_len(st.tokens, prompt)
            if n > best_len:
                best, best_len = s, n
        if best is None:
            raise ConfigError(f"all {self.max_sequences} sequences of this {self.name} context are in use")
        self._seqs[best].busy = True
        return best

    def release_sequence(self, seq_id: int, keep_cache: bool = True) -> None:
        """Mark a sequence free; its cache stays for prefix reuse unless ``keep_cache`` is False."""
        if not keep_cache:
            self.truncate(seq_id, 0)
        self._seqs[seq_id].busy = False

    def cached_tokens(self, seq_id: int) -> list[int]:
        """Tokens whose keys/values are in the sequence's cache (do not mutate)."""
        return self._seqs[seq_id].tokens

    def truncate(self, seq_id: int, n_tokens: int) -> None:
        """Roll the cache of ``seq_id`` back to its first ``n_tokens`` tokens (no recomputation)."""
        st = self._seqs[seq_id]
        if st.tree is not None:
            self.commit_path(seq_id, [])
        if n_tokens < len(st.tokens):
            self._truncate_cache(seq_id, n_tokens)
            del st.tokens[n_tokens:]

    def reuse_prefix(self, seq_id: int, tokens: Sequence[int], keep_last: int = 1) -> int:
        """Keep the longest cached prefix of ``tokens[:len(tokens) - keep_last]``; drop the rest.

        Returns the number of tokens kept, so that ``tokens[kept:]`` remain to be
        evaluated (at least ``keep_last`` of them, whose logits are needed).
        """
        limit = max(len(tokens) - keep_last, 0)
        n = common_prefix_len(self._seqs[seq_id].tokens, tokens[:limit])
        self.truncate(seq_id, n)
        return n

    def forward(self, requests: Sequence[ForwardRequest]) -> list[ForwardResult]:
        """Append each request's tokens to its sequence's cache in one batched pass.

        Raises:
            ContextOverflowError: a sequence would exceed ``n_ctx`` positions.
            NotImplementedError: a tree request on a backend without tree support,
                or hidden states where unsupported.
        """
        for r in requests:
            st = self._seqs[r.seq_id]
            if st.tree is not None:
                raise RuntimeError(f"sequence {r.seq_id} has an uncommitted tree: call commit_path first")
            # positions used: a chain's tokens one after another, a tree's nodes at their depths
            depth = len(r.tokens) if r.tree_parents is None else max(tree_depths(r.tree_parents), default=0)
            need = len(st.tokens) + depth
            if need > self.n_ctx:
                raise ContextOverflowError(
                    f"sequence needs {need} positions but the "
                    f"{self.name} context holds {self.n_ctx} (raise --ctx-size)"
                )
            if r.tree_parents is not None:
                if not self.supports_tree:
                    raise NotImplementedError(
                        f"this {self.name} context does not verify token trees"
                        + (" (create it with tree_width > 0)" if self.name == "llama.cpp" else "")
                    )
                if len(r.tree_parents) != len(r.tokens):
                    raise ValueError("tree_parents must have one entry per token")
                tree_depths(r.tree_parents)  # validates the ordering
            if r.hidden and not self.supports_hidden:
                raise NotImplementedError(f"the {self.name} backend does not return hidden states")
            if r.hidden and r.hidden_layers and not self.supports_layer_hidden:
                raise NotImplementedError(f"the {self.name} backend does not return intermediate layers' hidden states")
        t0 = time.perf_counter()
        results = self._forward(requests)
        self.forward_time_s += time.perf_counter() - t0
        for r in requests:
            st = self._seqs[r.seq_id]
            if r.tree_parents is None:
                st.tokens.extend(int(t) for t in r.tokens)
            else:
                st.tree = ([int(t) for t in r.tokens], [int(p) for p in r.tree_parents])
        return results

    def commit_path(self, seq_id: int, path: Sequence[int]) -> int:
        """After a tree forward: keep the tokens on ``path`` and drop the rest of the tree.

        Args:
            path: indices into the tree request's ``tokens``: index 0 (or nothing),
                then each next one a child of the previous.

        Returns:
            How many leading tokens of ``path`` stay cached. A backend may keep
            fewer than all (llama.cpp keeps only the part laid out contiguously, so
            the cache stays exactly as plain decoding would have built it); the
            caller feeds the others again.
        """
        st = self._seqs[seq_id]
        if st.tree is None:
            raise RuntimeError(f"sequence {seq_id} has no tree to commit")
        toks, parents = st.tree
        prev = -1
        for i in path:
            if parents[i] != prev:
                raise ValueError(f"path {list(path)} is not a chain from the root of the tree")
            prev = i
        kept = self._commit_tree(seq_id, len(st.tokens), toks, parents, list(path))
        st.tree = None
        st.tokens.extend(toks[i] for i in path[:kept])
        return kept

    def _commit_tree(self, seq_id: int, base: int, tokens: list[int], parents: list[int], path: list[int]) -> int:
        raise NotImplementedError  # pragma: no cover - only backends with supports_tree

    @abc.abstractmethod
    def _forward(self, requests: Sequence[ForwardRequest]) -> list[ForwardResult]:
        """Run the model; positions start at each sequence's current cache length."""

    @abc.abstractmethod
    def _truncate_cache(self, seq_id: int, n_tokens: int) -> None:
        """Drop cache entries at positions >= n_tokens."""

    # ---- tokenizer ----------------------------------------------------------------

    @abc.abstractmethod
    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text`` (with BOS where the model wants one when add_special)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped."""

    @abc.abstractmethod
    def token_text(self, token_id: int) -> str:
        """The vocabulary entry of one id, special tokens rendered (for comparing vocabularies)."""

    @property
    @abc.abstractmethod
    def chat_template(self) -> str | None:
        """The model's chat template (Jinja source) or None."""

    @abc.abstractmethod
    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of ``messages`` rendered with the model's template and a generation prompt."""

    def cost_key(self) -> str:
        """Identifies this model on this machine and settings, for cached cost measurements."""
        import hashlib
        import platform

        raw = f"{self.name}|{self.model_id}|{platform.node()}|{self._cost_identity()}"
        return hashlib.sha256(raw.encode()).hexdigest()[:20]

    def _cost_identity(self) -> str:
        return ""

    def threads_held(self):
        """A context manager within which forwards keep one fixed thread count (for timing T(n));
        only backends that change the count on their own (llama.cpp, backends/threads.py) need it."""
        return contextlib.nullcontext()

    def contended(self) -> bool:
        """True when the last forwards ran on a machine whose cores other processes held (then timings
        say little about the model); backends that cannot tell answer False."""
        return False

    def cpu_threads_now(self) -> int | None:
        """CPU threads the backend's forwards run on now (the count its thread governor last chose), so that a
        drafter's own CPU work in the same process can follow it; None for a backend that does not choose one."""
        return None

    def close(self) -> None:
        """Free the model and caches."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- helpers --------------------------------------------------------------

    def check_prompt_fits(self, n_prompt: int) -> None:
        if n_prompt == 0:
            raise ConfigError("the prompt is empty")
        if n_prompt >= self.n_ctx:
            raise ContextOverflowError(
                f"prompt has {n_prompt} token{'' if n_prompt == 1 else 's'} but the target's context window is {self.n_ctx} "
                f"(it must leave room for at least one new token; raise --ctx-size)"
            )

    def non_embedding_parameters(self) -> int:
        """Parameters outside the token embeddings and the output head (the usual measure of a
        drafter's size relative to its target)."""
        raise NotImplementedError

    def vocabulary_sample(self, n: int = 512) -> list[tuple[int, str]]:
        """(id, text) of evenly spread ids, first and last ids included; compares vocabularies cheaply."""
        v = self.vocab_size
        ids = sorted(set(np.linspace(0, v - 1, num=min(n, v), dtype=np.int64).tolist()) | set(range(min(32, v))))
        return [(i, self.token_text(i)) for i in ids]

    def token_bytes_table(self) -> list[bytes | None]:
        """Per token id, the bytes it adds to decoded text; None for control tokens (BOS, end of turn),
        which :meth:`decode` leaves out. Computed once per backend (cross-vocabulary drafting compares
        tokenizers by these bytes).

        This generic version decodes each id alone, so a token holding part of a UTF-8 character
        (decoded as U+FFFD) gets None; backends that can return raw bytes override it.
        """
        cached = getattr(self, "_token_bytes", None)
        if cached is None:
            cached = []
            for i in range(self.vocab_size):
                t = self.decode([i])
                cached.append(t.encode("utf-8") if t and "\ufffd" not in t else None)
            self._token_bytes = cached
        return cached
