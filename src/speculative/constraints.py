"""Structured output: JSON, JSON Schema, regular expressions and grammars (Lark or GBNF), through llguidance.

A :class:`ConstraintSpec` says what the output must match. :meth:`Constraint.compile`
binds it to the target's tokenizer (an ``llguidance.LLMatcher``: the guidance
project's Rust library, a derivative-based lexer under an Earley parser, built
for this: it computes a token mask in tens of microseconds, consumes tokens and
rolls them back).

How the engine decodes under a constraint (plain decoding is the case k = 0):

* every row of target logits the engine verifies, the first token's included,
  is masked (forbidden tokens get -inf) by the constraint's state after the
  tokens before that position: exactly what plain constrained decoding does,
  so greedy output is identical and sampled output is distributed as the
  constrained target (masking p alone keeps modified rejection sampling exact);
* a draft is cut before verification at its first forbidden token (it would be
  rejected anyway: its masked p is 0), which costs nothing. A drafter that
  samples (q != one-hot) must not simply drop that token: after the cut, the
  residual norm(max(0, p - q)) is drawn at its position, as verifying it would
  (:meth:`Constraint.chain_masks` reports the cut token for that);
* a draft is also cut after a token that completes the grammar (nothing more
  may follow), and generation ends there (finish reason "stop"); an end-of-
  generation token is allowed exactly where the grammar may end;
* the matcher consumes only committed tokens: masks along a draft are computed
  by consuming the draft and rolling it back;
* steerable drafters (n-gram, draft model) receive a :class:`DraftGuide` and
  propose only allowed tokens; a draft model then samples from its masked
  distribution, which is the q it reports.

Arrays: masks are bool ``[V]`` (or ``[n, V]``), True where a token is allowed;
V is the target's logits width.
"""

from __future__ import annotations

import functools
import json
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError

#: the kinds of constraint: any JSON object, a JSON Schema, a regular expression, a Lark or GBNF grammar
KINDS = ("json_object", "json_schema", "regex", "grammar")

_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MATCHERS: OrderedDict = OrderedDict()  # (id(tokenizer), spec) -> (tokenizer, matcher never advanced)
_MATCHERS_LOCK = threading.Lock()


def _llguidance():
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise ConfigError("structured output needs llguidance (pip install llguidance)") from e
    return llguidance


def _one_line(msg: str) -> str:
    """llguidance's multi-line error (source excerpt, caret) as one line."""
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    if not lines:
        return "invalid"
    out = lines[0]
    detail = next((ln for ln in lines[1:] if ln.startswith("error:")), None)
    if detail and detail not in out:
        out = f"{out.rstrip(':')}: {detail[len('error:'):].strip()}"
    return out


@dataclass(frozen=True)
class ConstraintSpec:
    """What the output must match.

    Attributes:
        kind: "json_object" (any JSON object), "json_schema", "regex" (the whole output matches it; Rust
            ``regex`` syntax, without anchors) or "grammar" (Lark, or llama.cpp's GBNF, detected by ``::=``).
        source: the schema as JSON text, the regular expression, or the grammar text ("" for json_object).
    """

    kind: str
    source: str = ""

    @classmethod
    def json_object(cls) -> ConstraintSpec:
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: Mapping | str) -> ConstraintSpec:
        """From a schema (a dict, or its JSON text). Raises ConfigError if it is not a JSON object."""
        if isinstance(schema, str):
            try:
                parsed = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConfigError(f"the JSON schema is not valid JSON: {e}") from None
        else:
            parsed = schema
        if not isinstance(parsed, Mapping):
            raise ConfigError(f"a JSON schema must be a JSON object, got {type(parsed).__name__}")
        return cls("json_schema", json.dumps(parsed))

    @classmethod
    def regex(cls, pattern: str) -> ConstraintSpec:
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, text: str) -> ConstraintSpec:
        return cls("grammar", text)

    def describe(self) -> str:
        return self.kind.replace("_", " ")

    def llguidance_grammar(self) -> str:
        """The llguidance grammar definition. Raises ConfigError on a grammar that cannot be converted."""
        llg = _llguidance()
        if self.kind == "json_object":
            return llg.grammar_from("json_schema", json.dumps({"type": "object"}))
        if self.kind == "json_schema":
            return llg.grammar_from("json_schema", self.source)
        if self.kind == "regex":
            return llg.grammar_from("regex", self.source)
        try:
            return llg.grammar_from("grammar", self.source)
        except ValueError as e:  # GBNF that does not convert
            raise ConfigError(f"invalid grammar: {_one_line(str(e))}") from None

    def validate(self) -> ConstraintSpec:
        """Return self, or raise :class:`ConfigError` with llguidance's message in one line."""
        if self.kind not in KINDS:
            raise ConfigError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise ConfigError(f"the {self.describe()} must be text, got {type(self.source).__name__}")
        if self.kind != "json_object" and not self.source.strip():
            raise ConfigError(f"the {self.describe()} is empty")
        err = _grammar_error(self)
        if err:
            raise ConfigError(f"invalid {self.describe()}: {err}")
        return self


@functools.lru_cache(maxsize=128)
def _grammar_error(spec: ConstraintSpec) -> str:
    """llguidance's complaint about a spec's grammar, in one line ("" when it compiles); cached."""
    try:
        grammar = spec.llguidance_grammar()
    except ConfigError as e:
        return str(e).removeprefix("invalid grammar: ")
    except ValueError as e:  # a schema llguidance cannot read
        return _one_line(str(e))
    err = _llguidance().LLMatcher.validate_grammar(grammar)
    return _one_line(err) if err else ""


def spec_from_options(*, json_schema=None, regex: str | None = None, grammar: str | None = None,
                      json_object: bool = False) -> ConstraintSpec | None:
    """The constraint the API's keywords ask for (at most one of them), or None."""
    given = [k for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar),
                            ("json_object", json_object)) if v not in (None, False)]
    if len(given) > 1:
        raise ConfigError(f"give at most one of json_schema, regex, grammar, json_object (got {', '.join(given)})")
    if json_schema is not None:
        return ConstraintSpec.json_schema(json_schema)
    if regex is not None:
        return ConstraintSpec.regex(regex)
    if grammar is not None:
        return ConstraintSpec.grammar(grammar)
    if json_object:
        return ConstraintSpec.json_object()
    return None


def tokenizer_for(backend):
    """The llguidance tokenizer of a backend's vocabulary (built once per backend, ~1 s, then cached).

    llama.cpp: every token's bytes from the GGUF vocabulary (control tokens marked
    so that text never matches them); transformers: the fast tokenizer's JSON. The
    backend's end-of-generation tokens are the grammar's end tokens. A backend that wraps
    another (a proxy, a test double) may name it in a ``tokenizer_of`` attribute.
    """
    tok = _TOKENIZERS.get(backend)
    if tok is not None:
        return tok
    inner = getattr(backend, "tokenizer_of", None)
    if inner is not None:
        tok = tokenizer_for(inner)
        _TOKENIZERS[backend] = tok
        return tok
    llg = _llguidance()
    eos = sorted(int(t) for t in backend.eos_token_ids)
    if backend.name == "llama.cpp":
        from llguidance.llamacpp import lltokenizer_from_vocab

        with warnings.catch_warnings():  # llguidance calls llama_token_get_attr, deprecated, once per token
            warnings.simplefilter("ignore", DeprecationWarning)
            tok = lltokenizer_from_vocab(backend._vocab, n_vocab=backend.vocab_size, eos_token=eos or None)
    elif hasattr(getattr(backend, "tokenizer", None), "backend_tokenizer"):
        import copy

        bt = copy.copy(backend.tokenizer.backend_tokenizer)
        bt.no_padding()
        bt.no_truncation()
        tok = llg.LLTokenizer(bt.to_str(), n_vocab=backend.vocab_size, eos_token=eos or None)
    else:
        raise ConfigError(f"structured output is not available for the {backend.name} backend's tokenizer")
    _TOKENIZERS[backend] = tok
    return tok


class Constraint:
    """One request's constraint state: an llguidance matcher that has consumed the committed output.

    Args:
        matcher: an ``llguidance.LLMatcher`` at the start of the output.
        vocab_size: V, the width of the target's logits.
    """

    def __init__(self, matcher, vocab_size: int, spec: ConstraintSpec | None = None):
        self.matcher = matcher
        self.vocab_size = int(vocab_size)
        self.spec = spec

    @classmethod
    def compile(cls, spec: ConstraintSpec, backend) -> Constraint:
        """Bind ``spec`` to ``backend``'s tokenizer. Raises ConfigError on an invalid schema, regex or grammar.

        Compiling costs 1-3 ms; the last 32 compiled specs are kept and copied (microseconds), so
        requests that repeat a schema pay it once.
        """
        tok = tokenizer_for(backend)
        key = (id(tok), spec)
        with _MATCHERS_LOCK:
            hit = _MATCHERS.get(key)
            if hit is not None and hit[0] is tok:
                _MATCHERS.move_to_end(key)
                return cls(hit[1].deep_copy(), backend.vocab_size, spec)
        m = _llguidance().LLMatcher(tok, spec.llguidance_grammar(), log_level=0)
        if m.is_error():
            raise ConfigError(f"invalid {spec.describe()}: {_one_line(m.get_error())}")
        with _MATCHERS_LOCK:
            _MATCHERS[key] = (tok, m)
            while len(_MATCHERS) > 32:
                _MATCHERS.popitem(last=False)
        return cls(m.deep_copy(), backend.vocab_size, spec)

    # ---- state --------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """True when nothing may follow (the grammar is complete): generation ends."""
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """True when the output may end here (an end-of-generation token is allowed)."""
        return self.matcher.is_accepting()

    def mask(self) -> np.ndarray:
        """bool ``[V]``: the tokens allowed after the tokens consumed so far."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little").astype(bool)
        V = self.vocab_size
        if allowed.shape[0] >= V:
            return allowed[:V]
        return np.concatenate([allowed, np.zeros(V - allowed.shape[0], dtype=bool)])

    def consume(self, token: int) -> None:
        """Advance by one committed token. Raises RuntimeError if the constraint forbids it (a bug:
        every emitted token comes from a masked distribution)."""
        if not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"token {int(token)} violates the constraint: {_one_line(self.matcher.get_error())}")

    def rollback(self, n: int) -> None:
        if n and not self.matcher.rollback(int(n)):
            raise RuntimeError(f"constraint rollback of {n} tokens failed: {_one_line(self.matcher.get_error())}")

    # ---- drafts ---------------------------------------------------------------------

    def chain_masks(self, draft: Sequence[int]) -> tuple[int, np.ndarray, bool]:
        """Masks at a draft chain's positions; the state is unchanged afterwards.

        Returns:
            (n, masks, forbidden): ``draft[:n]`` is what may be verified; ``masks`` bool ``[n + 1, V]``,
            row i the tokens allowed after the committed output and ``draft[:i]``; ``forbidden`` is True
            when ``draft[n]`` exists and the constraint forbids it (False when the draft ends, or when
            ``draft[n-1]`` completes the grammar).
        """
        masks = [self.mask()]
        n = 0
        forbidden = False
        try:
            for t in draft:
                t = int(t)
                if self.stopped:
                    break
                if not (0 <= t < self.vocab_size and masks[-1][t]):
                    forbidden = True
                    break
                self.consume(t)
                n += 1
                masks.append(self.mask())
        finally:
            self.rollback(n)
        return n, np.stack(masks), forbidden

    def tree_masks(self, tokens: Sequence[int], parents: Sequence[int]) -> tuple[list[int], np.ndarray, list]:
        """A token tree's allowed nodes and the masks after each; the state is unchanged afterwards.

        Args:
            tokens, parents: the tree (parents before children, -1 the last committed token).

        Returns:
            (keep, root_mask, node_masks): ``keep`` the nodes whose path is allowed (a node whose parent
            completes the grammar is dropped), in order; ``root_mask`` bool ``[V]``; ``node_masks[i]`` the
            mask after node ``keep[i]``'s path.
        """
        from .trees import children

        kids = children(parents)
        root = self.mask()
        keep: list[int] = []
        after: dict[int, np.ndarray] = {}

        def visit(u: int, mask: np.ndarray) -> None:
            if self.stopped:
                return
            for c in kids.get(u, []):
                t = int(tokens[c])
                if not (0 <= t < self.vocab_size and mask[t]):
                    continue
                self.consume(t)
                try:
                    keep.append(c)
                    after[c] = self.mask()
                    visit(c, after[c])
                finally:
                    self.rollback(1)

        visit(-1, root)
        keep.sort()
        return keep, root, [after[i] for i in keep]

    def guide(self) -> DraftGuide:
        return DraftGuide(self)


class DraftGuide:
    """What a steerable drafter may ask of the request's constraint while it drafts.

    The guide starts at the committed output; :meth:`push` advances it along the draft.
    The engine calls :meth:`release` after the proposal (the constraint is unchanged then).
    """

    def __init__(self, constraint: Constraint):
        self._c = constraint
        self._pushed = 0

    def mask(self) -> np.ndarray:
        """bool ``[V]``: tokens allowed at the draft's current end."""
        return self._c.mask()

    def push(self, token: int) -> bool:
        """Extend the draft by ``token``; False (and nothing changes) if it is forbidden."""
        if self._c.matcher.validate_tokens([int(token)]) != 1:
            return False
        self._c.consume(token)
        self._pushed += 1
        return True

    @property
    def stopped(self) -> bool:
        """True when the draft so far completes the grammar (nothing more to propose)."""
        return self._c.stopped

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` are allowed from the draft's current end (nothing changes)."""
        toks = [int(t) for t in tokens]
        if not toks:
            return 0
        if any(not 0 <= t < self._c.vocab_size for t in toks):
            bad = next(i for i, t in enumerate(toks) if not 0 <= t < self._c.vocab_size)
            toks = toks[:bad]
        return int(self._c.matcher.validate_tokens(toks)) if toks else 0

    def release(self) -> None:
        self._c.rollback(self._pushed)
        self._pushed = 0


def apply_masks(logits: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Logits ``[n, V]`` with forbidden tokens at -inf (a new float32 array; the input is not modified)."""
    return np.where(masks, logits, np.float32(-np.inf)).astype(np.float32, copy=False)


__all__ = ["ConstraintSpec", "Constraint", "DraftGuide", "apply_masks", "spec_from_options", "tokenizer_for", "KINDS"]
