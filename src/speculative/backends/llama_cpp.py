"""llama.cpp backend (GGUF models) through llama-cpp-python's low-level C API.

Exact numerics (the default, ``numerics="exact"``): a position's logits must
not depend on how many tokens share its forward pass, or greedy speculation
drifts from plain greedy decoding. Measured on this project's CPUs, that needs:

  * a build without llamafile's sgemm (``CMAKE_ARGS="-DGGML_LLAMAFILE=OFF"``);
  * flash attention off (``flash_attn_type`` disabled; 'auto' enables it on CPU);
  * none of llama.cpp's repacked weight layouts (its Q4_0/Q4_K kernels take a
    different path from 4 rows on): the model loads with
    ``GGML_CPU_BATCH_INVARIANT=1``, which the patched build
    (``patches/llama-cpp-batch-invariant.patch``) reads to put the weights its
    batch-invariant kernels support into their own repacked layout (CPU_BIMM,
    docs/kernels.md) and to keep every other weight in ggml's plain layout;
  * no tiled K-quant matmul (``GGML_CPU_TILED_MM=0``, read once per process:
    it takes over from 8 rows on).

With all four a position's logits are bitwise identical alone or in a batch of
any size. ``numerics="fast"`` keeps llama.cpp's defaults: lossless only up to
kernel numerics. :mod:`speculative.numerics` checks the build at start-up.

Sliding-window models (Gemma 3) use a full-size cache (``swa_full``), so a
rollback may reach any position.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import BackendUnavailableError, ConfigError, ModelLoadError, ModelNotFoundError
from .base import Backend, ForwardRequest, ForwardResult
from .threads import ThreadGovernor, default_threads

_lib_lock = threading.Lock()
_backend_ready = False
_log_callback = None  # keep the ctypes callback alive for the process
_verbose = False


def _llama():
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise BackendUnavailableError(
            "the llama.cpp backend needs llama-cpp-python; run the README's set-up "
            "(it builds llama-cpp-python with -DGGML_LLAMAFILE=OFF)"
        ) from e
    return llama_cpp


def _init_library(exact: bool, verbose: bool = False) -> None:
    global _backend_ready, _log_callback, _verbose
    if exact:
        # ggml reads this once, at the first matmul of the process.
        os.environ["GGML_CPU_TILED_MM"] = "0"
    with _lib_lock:
        if _backend_ready:
            return
        L = _llama()

        def _log(level, text, user_data):  # pragma: no cover - only prints when verbose
            if _verbose and text:
                print(text.decode("utf-8", "replace"), end="", flush=True)

        _verbose = verbose
        _log_callback = L.llama_log_callback(_log)
        L.llama_log_set(_log_callback, ctypes.c_void_p())
        L.llama_backend_init()
        _backend_ready = True


@contextlib.contextmanager
def _env_during(values: dict[str, str | None]):
    """Each variable set to its value in the environment (None: left as it is) under the library lock,
    for a llama.cpp call that reads them; the old values (or their absence) are restored afterwards."""
    with _lib_lock:
        old = {name: os.environ.get(name) for name in values}
        for name, value in values.items():
            if value is not None:
                os.environ[name] = value
        try:
            yield
        finally:
            for name, value in old.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _load_mode(exact: bool):
    """Model loading in batch-invariant mode or not (the patched build reads ``GGML_CPU_BATCH_INVARIANT``
    as weights are placed: in that mode the weights its kernels support are repacked into their
    row-interleaved layout, CPU_BIMM, and llama.cpp's batch-dependent repacked layouts decline every
    weight; docs/kernels.md). A loaded model keeps its layout whatever the variable says later."""
    return _env_during({"GGML_CPU_BATCH_INVARIANT": "1" if exact else "0"})


#: exact numerics: attention reads the K/V cells padded to a multiple of 64 (llama.cpp pads to 256 unless
#: LLAMA_KV_N_PAD_MIN says otherwise; the patch adds that variable): fewer masked cells per forward
#: (at 600 tokens of context, 640 cells instead of 768). Masked cells add exact zeros at the end of each
#: lane of the caches' dot products (ggml_bimm_f16_dot: 16 lanes) and whole vectors of zeros to the
#: softmax's sums (16 floats with AVX-512, 8 with AVX2), so batch invariance keeps whatever the padding
#: above that (docs/kernels.md); `speculative doctor` checks it on every bundled model.
EXACT_KV_PAD = 64


def _context_mode(exact: bool):
    """Context creation for exact numerics: the K/V padding (``LLAMA_KV_N_PAD_MIN``) and the caches
    flagged batch-invariant (``LLAMA_KV_BATCH_INVARIANT=1``: attention's products with them take
    ggml_bimm_f16_dot's order, whatever the batch size). The patched llama.cpp reads both as a context's
    cache is made; other builds ignore them. Fast numerics keep llama.cpp's attention products and leave
    the padding as the user set it."""
    return _env_during({"LLAMA_KV_N_PAD_MIN": str(EXACT_KV_PAD) if exact else None,
                        "LLAMA_KV_BATCH_INVARIANT": "1" if exact else "0"})


def system_info() -> str:
    """llama.cpp's build/CPU feature line (e.g. 'AVX2 = 1 | ... | LLAMAFILE = 1')."""
    return _llama().llama_print_system_info().decode("utf-8", "replace").strip()


def is_gguf_file(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


class LlamaCppBackend(Backend):
    """A GGUF model in a llama.cpp context with ``max_sequences`` KV-cache sequences.

    Args:
        path: GGUF file.
        n_ctx: positions per sequence; 0 means the model's training context. Capped at it.
        n_threads: CPU threads, kept fixed; None: the physical cores, fewer while other processes keep
            them busy (exact numerics only: ``thread_governor``, backends/threads.py).
        max_sequences: sequences held at once (several clients of a server).
        numerics: "exact" (batch-invariant logits, the default) or "fast".
        n_batch: most tokens per llama_decode call (prompts are split into such chunks); llama.cpp
            lowers it to the context size, and so does this backend.
        model_id: the name shown in stats and errors.
        tree_width: most leaves of a token tree verified at once; 0 disables trees.
            Trees need per-token sequence ids in one unified KV buffer: each leaf's
            path gets a temporary sequence that shares the context's cells. Nodes
            are laid out spine first (the chain of first children), and only the
            spine's cells are kept after verification, so the cache stays laid out
            exactly as plain decoding builds it; an accepted path that leaves the
            spine is fed again in the next step.

    Raises:
        ModelNotFoundError: no file at ``path``.
        ModelLoadError: the file is not a loadable GGUF model.
    """

    name = "llama.cpp"

    def __init__(
        self,
        path: str | os.PathLike,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        max_sequences: int = 1,
        numerics: str = "exact",
        n_batch: int = 512,
        model_id: str | None = None,
        verbose: bool = False,
        tree_width: int = 0,
    ):
        super().__init__()
        if numerics not in ("exact", "fast"):
            raise ConfigError(f"numerics must be 'exact' or 'fast', got {numerics!r}")
        pad = os.environ.get("LLAMA_KV_N_PAD_MIN")
        if numerics == "fast" and pad is not None and not (pad.isdigit() and int(pad) & (int(pad) - 1) == 0 < int(pad)):
            # llama.cpp would ignore it with a warning in its silenced log (exact numerics set their own value)
            raise ConfigError(f"LLAMA_KV_N_PAD_MIN={pad!r}: the K/V padding must be a power of two "
                              "(llama.cpp's default 256)")
        self.path = Path(path)
        self.model_id = model_id or self.path.name
        self.numerics = numerics
        if not self.path.is_file():
            raise ModelNotFoundError(f"no model file at {self.path}")
        if not is_gguf_file(self.path):
            raise ModelLoadError(f"{self.path} is not a GGUF file (wrong magic bytes)")
        _init_library(numerics == "exact", verbose)
        L = self._L = _llama()
        self._model = None
        self._ctx = None
        self._batch = None

        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        if numerics == "exact" and "BATCH_INVARIANT_MM = 1" not in system_info():
            mp.use_extra_bufts = False  # a build without the patch: no repacked layouts at all (batch-dependent)
        with _load_mode(numerics == "exact"):
            model = L.llama_model_load_from_file(str(self.path).encode(), mp)
        if not model:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: corrupt or unsupported GGUF")
        self._model = model
        self._vocab = L.llama_model_get_vocab(model)
        self.vocab_size = int(L.llama_vocab_n_tokens(self._vocab))
        self.hidden_size = int(L.llama_model_n_embd(model))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(model))
        self.n_swa = int(L.llama_model_n_swa(model))

        if n_ctx is None or n_ctx <= 0:
            n_ctx = self.n_ctx_train
        n_ctx = min(int(n_ctx), self.n_ctx_train) if self.n_ctx_train > 0 else int(n_ctx)
        if max_sequences < 1:
            raise ConfigError("max_sequences must be >= 1")
        self.max_sequences = int(max_sequences)
        self._init_sequences()
        self.n_threads = default_threads() if n_threads is None else int(n_threads)
        cpus = os.cpu_count() or 1
        if not 1 <= self.n_threads <= cpus:
            # more threads than CPUs only wait for each other at every barrier (999 ran for minutes)
            raise ConfigError(f"threads must be between 1 and {cpus} (this machine's CPUs), got {n_threads}")
        # threads left to the backend (n_threads=None) follow the machine's load, where logits do not
        # depend on the count (exact numerics); a count the caller gave is kept (backends/threads.py)
        self.thread_governor = (ThreadGovernor(self.n_threads)
                                if n_threads is None and numerics == "exact" and self.n_threads > 1 else None)
        self._threads_now = self.n_threads
        self._threads_held = 0

        self.tree_width = int(tree_width)
        if self.tree_width < 0:
            raise ConfigError(f"tree_width must be >= 0, got {tree_width}")
        cp = L.llama_context_default_params()
        cp.n_batch = int(n_batch)
        cp.n_ubatch = int(n_batch)
        if self.tree_width:
            # trees: one unified buffer, temporary sequences per leaf share the context's cells
            cp.kv_unified = True
            cp.n_seq_max = self.max_sequences * (1 + self.tree_width)
            cp.n_ctx = n_ctx * self.max_sequences + 256
        else:
            # one KV stream per sequence (kv_unified off): a sequence's cells stay
            # contiguous and in order, whatever other sequences do
            cp.kv_unified = False
            cp.n_seq_max = self.max_sequences
            cp.n_ctx = n_ctx * self.max_sequences
        cp.n_threads = self.n_threads
        cp.n_threads_batch = self.n_threads
        cp.swa_full = True
        cp.pooling_type = L.LLAMA_POOLING_TYPE_NONE
        cp.embeddings = False
        if numerics == "exact":
            cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        with _context_mode(numerics == "exact"):
            ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            self.close()
            raise ModelLoadError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.path}")
        self._ctx = ctx
        self._mem = L.llama_get_memory(ctx)
        # llama.cpp pads a context to a multiple of 256 cells; the window is what was asked for
        self.n_ctx = n_ctx if self.tree_width else min(n_ctx, int(L.llama_n_ctx_seq(ctx)))
        self.supports_tree = self.tree_width > 0
        self.tree_spine_only = numerics == "exact"
        self.n_batch = int(n_batch)
        self._embeddings_on = False
        self.batch_invariant = numerics == "exact"

        # llama.cpp caps a decode call at min(n_batch, the context asked for) tokens (and aborts past it):
        # longer inputs are fed in chunks of at most that many, one micro-batch each
        self._batch_cap = max(1, min(self.n_batch, int(L.llama_n_batch(ctx)), int(L.llama_n_ubatch(ctx))))
        self._batch = L.llama_batch_init(self._batch_cap, 0, cp.n_seq_max)
        b = self._batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(self._batch_cap,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self._batch_cap,))
        self._nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(self._batch_cap,))
        self._out = np.ctypeslib.as_array(b.logits, shape=(self._batch_cap,))
        self._slot_seq = np.full(self._batch_cap, -1, dtype=np.int64)

        self.eos_token_ids = self._end_of_generation_ids()
        bos = L.llama_vocab_bos(self._vocab)
        self.bos_token_id = int(bos) if bos >= 0 else None
        self._chat_template = self._read_chat_template()
        self._formatter = None

    # ---- model facts ------------------------------------------------------------

    def _end_of_generation_ids(self) -> frozenset[int]:
        """llama.cpp's end-of-generation set: EOS, EOT, EOM and end-of-turn tokens."""
        L = self._live()
        return frozenset(t for t in range(self.vocab_size) if L.llama_vocab_is_eog(self._vocab, t))

    def _read_chat_template(self) -> str | None:
        L = self._live()
        tmpl = L.llama_model_chat_template(self._model, None)
        if not tmpl:
            return None
        return tmpl.decode("utf-8", "replace")

    def non_embedding_parameters(self) -> int:
        from gguf import GGUFReader

        r = GGUFReader(str(self.path))
        return int(sum(int(t.n_elements) for t in r.tensors if t.name not in ("token_embd.weight", "output.weight")))

    def _cost_identity(self) -> str:
        from ..cache import file_key

        return f"{file_key(self.path)}|threads={self.n_threads}|{self.numerics}|batch={self.n_batch}"

    # ---- caches -------------------------------------------------------------------

    def _truncate_cache(self, seq_id: int, n_tokens: int) -> None:
        ok = self._live().llama_memory_seq_rm(self._mem, seq_id, n_tokens, -1)
        if not ok:  # pragma: no cover - only for recurrent models
            raise RuntimeError(f"llama.cpp could not roll sequence {seq_id} back to {n_tokens} tokens")

    @contextlib.contextmanager
    def threads_held(self):
        """Within this block every forward uses the full ``n_threads`` (for measuring T(n))."""
        self._threads_held += 1
        try:
            yield
        finally:
            self._threads_held -= 1

    def cpu_threads_now(self) -> int:
        return self._threads_now

    def contended(self) -> bool:
        """True when the last forwards' threads waited for cores that other processes held."""
        return self.thread_governor is not None and self.thread_governor.busy(min_samples=2)

    def _forward(self, requests: Sequence[ForwardRequest]) -> list[ForwardResult]:
        gov = self.thread_governor
        if gov is None:
            return self._forward_tokens(requests)
        n = sum(len(r.tokens) for r in requests)
        t = self.n_threads if self._threads_held else gov.threads_for(n)
        if t != self._threads_now:
            self._live().llama_set_n_threads(self._ctx, t, t)
            self._threads_now = t
        wall0, cpu0 = time.perf_counter(), time.process_time()
        out = self._forward_tokens(requests)
        gov.observe(t, n, time.perf_counter() - wall0, time.process_time() - cpu0)  # held ones too: early data
        return out

    def _forward_tokens(self, requests: Sequence[ForwardRequest]) -> list[ForwardResult]:
        L = self._live()
        want_hidden = any(r.hidden for r in requests)
        if want_hidden != self._embeddings_on:
            L.llama_set_embeddings(self._ctx, want_hidden)
            self._embeddings_on = want_hidden
        # Lay out every request's tokens; split into n_batch chunks when needed.
        plan = []  # (seq_id, token, pos, want_output)
        out_index: list[list[int]] = []
        for r in requests:
            start = len(self._seqs[r.seq_id].tokens)
            rows = r.output_rows()
            want = np.zeros(len(r.tokens), dtype=bool)
            want[rows] = True
            plan.append((r, start, want))
            out_index.append(rows)
        total = sum(len(r.tokens) for r in requests)
        if any(r.tree_parents is not None for r in requests):
            if total > self._batch_cap:
                raise ValueError(f"a tree forward takes at most {self._batch_cap} tokens")
            return self._decode_once(plan, out_index, want_hidden)
        if total <= self._batch_cap:
            return self._decode_once(plan, out_index, want_hidden)
        return self._decode_chunked(plan, out_index, want_hidden)

    # ---- token trees ------------------------------------------------------------------

    def _temp_seq(self, seq_id: int, j: int) -> int:
        return self.max_sequences + seq_id * self.tree_width + j

    def _tree_layout(self, seq_id: int, parents: Sequence[int]):
        """Positions offsets (depth - 1) and sequence-id sets of a tree's tokens."""
        from ..trees import children, depths, spine

        ch = children(parents)
        leaves = [i for i in range(len(parents)) if not ch[i]]
        if len(leaves) > self.tree_width:
            raise ValueError(f"the tree has {len(leaves)} leaves; this context takes at most {self.tree_width}")
        on_spine = set(spine(parents))
        sids: list[set[int]] = [set() for _ in parents]
        for j, leaf in enumerate(leaves):
            u = leaf
            while u >= 0:
                sids[u].add(self._temp_seq(seq_id, j))
                u = parents[u]
        for u in on_spine:
            sids[u].add(seq_id)
        return [d - 1 for d in depths(parents)], [sorted(x) for x in sids], len(leaves)

    def _prepare_tree(self, seq_id: int, n_leaves: int) -> None:
        L = self._L
        for j in range(n_leaves):
            t = self._temp_seq(seq_id, j)
            L.llama_memory_seq_rm(self._mem, t, -1, -1)
            L.llama_memory_seq_cp(self._mem, seq_id, t, -1, -1)

    def _commit_tree(self, seq_id: int, base: int, tokens, parents, path) -> int:
        from ..trees import spine

        sp = spine(parents)
        contiguous = 0
        while contiguous < len(sp) and sp[contiguous] == contiguous:
            contiguous += 1
        keep = 0
        while keep < len(path) and keep < contiguous and path[keep] == sp[keep]:
            keep += 1
        L = self._live()
        L.llama_memory_seq_rm(self._mem, seq_id, base + keep, -1)
        for j in range(self.tree_width):
            L.llama_memory_seq_rm(self._mem, self._temp_seq(seq_id, j), -1, -1)
        return keep

    def _fill(self, chunks) -> int:
        """Write (seq_id, tokens, start, want[, tree_parents]) chunks into the batch; returns n_tokens."""
        n = 0
        b = self._batch
        for chunk in chunks:
            seq_id, toks, start, want = chunk[:4]
            parents = chunk[4] if len(chunk) > 4 else None
            m = len(toks)
            self._tok[n : n + m] = toks
            self._out[n : n + m] = want
            if parents is None:
                self._pos[n : n + m] = np.arange(start, start + m)
                self._nseq[n : n + m] = 1
                for i in range(n, n + m):
                    if self._slot_seq[i] != seq_id:
                        b.seq_id[i][0] = seq_id
                        self._slot_seq[i] = seq_id
            else:
                offs, sids, n_leaves = self._tree_layout(seq_id, parents)
                self._prepare_tree(seq_id, n_leaves)
                self._pos[n : n + m] = start + np.asarray(offs)
                for k, ids in enumerate(sids):
                    i = n + k
                    self._nseq[i] = len(ids)
                    for j, sid in enumerate(ids):
                        b.seq_id[i][j] = sid
                    self._slot_seq[i] = -2  # multi-sequence slot: rewrite next time
            n += m
        b.n_tokens = n
        return n

    def _decode(self) -> None:
        rc = self._L.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with status {rc} (KV cache full or invalid batch)")

    def _rows(self, n_tokens: int, n_flagged: int, want_hidden: bool):
        """Views of the logits (and hidden) buffers of the last decode call.

        With embeddings on, llama.cpp outputs every token of the batch (in batch
        order); otherwise only the flagged ones, in batch order.
        """
        n_out = n_tokens if want_hidden else n_flagged
        L = self._L
        logits = np.ctypeslib.as_array(L.llama_get_logits(self._ctx), shape=(max(n_out, 1), self.vocab_size))
        hidden = None
        if want_hidden:
            hidden = np.ctypeslib.as_array(L.llama_get_embeddings(self._ctx), shape=(max(n_out, 1), self.hidden_size))
        return logits, hidden

    @staticmethod
    def _select(buf, batch_idx, flagged_rank, rows, want_hidden):
        """Rows of ``buf`` for request rows ``rows`` (indices into the request's tokens)."""
        if buf is None:
            return None
        idx = [batch_idx[r] if want_hidden else flagged_rank[r] for r in rows]
        if idx and idx == list(range(idx[0], idx[0] + len(idx))):
            return buf[idx[0] : idx[0] + len(idx)]  # contiguous: a view, no copy
        return buf[idx]

    def _decode_once(self, plan, out_index, want_hidden) -> list[ForwardResult]:
        n = self._fill([(r.seq_id, r.tokens, start, want, r.tree_parents) for r, start, want in plan])
        self._decode()
        n_flagged = int(sum(int(w.sum()) for _, _, w in plan))
        logits, hidden = self._rows(n, n_flagged, want_hidden)
        results = []
        base = 0
        flagged_before = 0
        for (r, _, want), rows in zip(plan, out_index):
            m = len(r.tokens)
            batch_idx = {i: base + i for i in range(m)}
            rank = np.cumsum(want) - 1 + flagged_before
            flagged_rank = {i: int(rank[i]) for i in range(m) if want[i]}
            lg = self._select(logits, batch_idx, flagged_rank, rows, want_hidden)
            hd = self._select(hidden, batch_idx, flagged_rank, rows, want_hidden) if r.hidden else None
            results.append(ForwardResult(lg, hd))
            base += m
            flagged_before += int(want.sum())
        return results

    def _decode_chunked(self, plan, out_index, want_hidden) -> list[ForwardResult]:
        """Long inputs (prompts): one request at a time, n_batch tokens per decode call."""
        results = []
        for (r, start, want), rows in zip(plan, out_index):
            toks = list(r.tokens)
            got: dict[int, tuple] = {}
            for c0 in range(0, len(toks), self._batch_cap):
                c1 = min(c0 + self._batch_cap, len(toks))
                w = want[c0:c1]
                n = self._fill([(r.seq_id, toks[c0:c1], start + c0, w)])
                self._decode()
                if not w.any():
                    continue
                logits, hidden = self._rows(n, int(w.sum()), want_hidden)
                rank = np.cumsum(w) - 1
                for i in np.nonzero(w)[0]:
                    j = int(i) if want_hidden else int(rank[i])
                    got[c0 + int(i)] = (logits[j].copy(), hidden[j].copy() if (hidden is not None and r.hidden) else None)
            lg = np.stack([got[i][0] for i in rows]) if rows else np.zeros((0, self.vocab_size), np.float32)
            hd = np.stack([got[i][1] for i in rows]) if (rows and r.hidden) else None
            results.append(ForwardResult(lg, hd))
        return results

    # ---- tokenizer ---------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        L = self._live()
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, True)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, True)
        ids = list(buf[:n])
        # a template that renders the BOS text, tokenized with add_special, yields two
        if (
            add_special
            and self.bos_token_id is not None
            and len(ids) >= 2
            and ids[0] == ids[1] == self.bos_token_id
        ):
            ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        L = self._live()
        n = len(ids)
        if n == 0:
            return ""
        arr = (L.llama_token * n)(*ids)
        cap = 8 * n + 16
        buf = ctypes.create_string_buffer(cap)
        m = L.llama_detokenize(self._vocab, arr, n, buf, cap, False, False)
        if m < 0:
            cap = -m
            buf = ctypes.create_string_buffer(cap)
            m = L.llama_detokenize(self._vocab, arr, n, buf, cap, False, False)
        return buf.raw[:m].decode("utf-8", "replace")

    def token_text(self, token_id: int) -> str:
        t = self._live().llama_vocab_get_text(self._vocab, int(token_id))
        return t.decode("utf-8", "replace") if t else ""

    def token_bytes_table(self) -> list[bytes | None]:
        """Raw bytes of every token's piece (llama_token_to_piece, specials not rendered); None for control tokens."""
        cached = getattr(self, "_token_bytes", None)
        if cached is None:
            L, vocab = self._L, self._vocab
            control = L.LLAMA_TOKEN_ATTR_CONTROL
            buf = ctypes.create_string_buffer(256)
            cached = []
            for i in range(self.vocab_size):
                if int(L.llama_vocab_get_attr(vocab, i)) & control:
                    cached.append(None)
                    continue
                n = L.llama_token_to_piece(vocab, i, buf, 256, 0, False)
                if n < 0:  # pragma: no cover - a piece longer than 256 bytes
                    big = ctypes.create_string_buffer(-n)
                    n = L.llama_token_to_piece(vocab, i, big, -n, 0, False)
                    cached.append(big.raw[:n] or None)
                else:
                    cached.append(buf.raw[:n] or None)
            self._token_bytes = cached
        return cached

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        if not self._chat_template:
            raise ConfigError(f"{self.model_id} has no chat template; use --no-chat")
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            L = self._live()
            bos = L.llama_vocab_bos(self._vocab)
            eos = L.llama_vocab_eos(self._vocab)
            self._formatter = Jinja2ChatFormatter(
                template=self._chat_template,
                eos_token=self.token_text(eos) if eos >= 0 else "",
                bos_token=self.token_text(bos) if bos >= 0 else "",
                add_generation_prompt=True,
            )
        prompt = self._formatter(messages=list(messages)).prompt
        return self.encode(prompt, add_special=True)

    def _live(self):
        """The llama.cpp bindings, while the model is loaded. Raises ModelLoadError after :meth:`close`
        (the model's memory is freed: a call into it would crash the process). Every public way in
        calls it once (:meth:`_forward` for the decode helpers it calls)."""
        if self._model is None:
            raise ModelLoadError(f"{self.model_id} was closed; load it again to use it")
        return self._L

    def close(self) -> None:
        L = getattr(self, "_L", None)
        if L is None:
            return
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
