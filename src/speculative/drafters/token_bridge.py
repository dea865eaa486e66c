"""Two tokenizers seen as bytes: re-tokenization across a token boundary, vocabulary comparison,
and the one-to-one map of the tokens two vocabularies share.

Used by :mod:`speculative.drafters.cross_vocab` (a draft model with another tokenizer than
the target's). Every token is compared by the bytes it adds to decoded text
(:meth:`~speculative.backends.base.Backend.token_bytes_table`), so that byte-level BPE
(``Ġhello``), SentencePiece (``▁hello``, byte fallback ``<0x0A>``) and special tokens line up.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..backends.base import Backend

#: texts a bridged tokenizer must reproduce byte for byte
_PROBES = ("Hello, world! It's 42.", "  two  spaces\n\tand a tab", "café naïve 東京 😀", "def f(x):\n    return x + 1\n")
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


# ---- bytes and UTF-8 ------------------------------------------------------------------------


def utf8_complete_len(b: bytes | bytearray) -> int:
    """Length of the longest prefix of ``b`` that does not end inside a UTF-8 character.

    A tail of 1-3 bytes that starts a multi-byte character but lacks its continuation
    bytes is cut; anything else (complete or invalid) is kept, so invalid bytes never
    hold text back forever.
    """
    n = len(b)
    i, k = n - 1, 0
    while i >= 0 and k < 3 and (b[i] & 0xC0) == 0x80:
        i -= 1
        k += 1
    if i < 0:
        return n
    lead = b[i]
    need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
    return i if n - i < need else n


def is_char_start(b: bytes | bytearray, i: int) -> bool:
    return i >= len(b) or (b[i] & 0xC0) != 0x80


# ---- one tokenizer, as bytes ----------------------------------------------------------------------


class TokenTable:
    """One backend's tokenizer seen as bytes.

    Attributes:
        pieces: per token id, the bytes it adds to decoded text, or None for control
            tokens (BOS, end of turn, ...), which decoded text leaves out.
        special: text of each control token -> id (for mapping control tokens by text).
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        self.pieces: list[bytes | None] = backend.token_bytes_table()
        bos = getattr(backend, "bos_token_id", None)
        probe = backend.encode("a", add_special=True)
        #: the BOS id the tokenizer adds by itself (None: it adds none)
        self.bos: int | None = bos if (bos is not None and probe and probe[0] == bos) else None
        self.special: dict[str, int] = {}
        for i, p in enumerate(self.pieces):
            if p is None:
                t = backend.token_text(i)
                if t and t not in self.special:
                    self.special[t] = i

    def bytes_of(self, ids: Sequence[int]) -> bytes:
        pieces = self.pieces
        return b"".join(pieces[i] or b"" for i in ids)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without BOS (special-token texts are parsed, as the backend does)."""
        return self.backend.encode(text, add_special=False) if text else []

    def round_trips(self) -> str | None:
        """None when encoding then joining pieces reproduces every probe text; else the first failure."""
        for s in _PROBES:
            got = self.bytes_of(self.encode(s))
            if got != s.encode():
                return f"{s!r} comes back as {got.decode('utf-8', 'replace')!r}"
        return None

    def render(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with control tokens written out (a leading BOS left out), for re-tokenizing a prompt."""
        out = bytearray()
        for j, i in enumerate(ids):
            p = self.pieces[i]
            if p is None:
                if j == 0 and i == self.bos:
                    continue
                p = self.backend.token_text(i).encode()
            out += p
        return out.decode("utf-8", "replace")


def retokenize(table: TokenTable, left: bytes, new: bytes, final: bool = False) -> list[int]:
    """Target token ids that continue committed text ending in ``left`` with the bytes ``new``.

    Args:
        table: the target's :class:`TokenTable`.
        left: bytes of the last few committed tokens (the look-behind window), starting
            at a character boundary; may be empty.
        new: the draft's bytes after the committed text.
        final: the draft text ends here (the drafter ended its turn): keep the last token.

    Returns:
        Ids whose joined bytes are a prefix of ``new``. ``left + new`` is tokenized
        and split where ``left`` ends; when a token straddles that boundary the
        window is dropped and ``new`` is tokenized alone. A trailing incomplete UTF-8
        character is cut, and (unless ``final``) so is the last token, which more text
        could still extend or merge. Tokens from the first one whose bytes differ from
        the text on (a normalizing tokenizer, a special token's text parsed) are cut.
    """
    n = utf8_complete_len(left + new) - len(left)
    if n <= 0:
        return []
    cut = n < len(new)
    new = new[:n]
    ids: list[int] | None = None
    for lb in (left, b""):
        if not lb and not is_char_start(new, 0):
            break
        try:
            enc = table.encode((lb + new).decode("utf-8"))
        except UnicodeDecodeError:
            return []
        pos, i = 0, 0
        while i < len(enc) and pos < len(lb):
            pos += len(table.pieces[enc[i]] or b"")
            i += 1
        if pos == len(lb) and table.bytes_of(enc[:i]) == lb:
            ids = enc[i:]
            break
        if not lb:
            break
    if not ids:
        return []
    # keep the ids whose bytes follow ``new`` exactly (a tokenizer may normalize text, or parse a
    # special token's text); those before a mismatch were tokenized knowing the text after them
    out, pos = [], 0
    for t in ids:
        p = table.pieces[t]
        if p is None or new[pos : pos + len(p)] != p:
            return out
        out.append(t)
        pos += len(p)
    return out if (final and not cut) else out[:-1]


# ---- comparing and mapping vocabularies --------------------------------------------------------


@dataclass
class VocabularyComparison:
    """Whether a draft model can share the target's token ids; ``reason`` names the first difference."""

    same: bool
    reason: str = ""


def vocab_label(b: Backend) -> str:
    return f"{b.model_id} ({b.vocab_size:,} tokens)"


def compare_vocabularies(target: Backend, draft: Backend) -> VocabularyComparison:
    """Compare token strings id by id over the whole vocabulary, then the special-token ids.

    Same means every id has the same string in both and BOS and the end-of-generation sets
    agree: draft ids can then be verified as target ids. Vocabularies of different sizes are
    never the same (ids one lacks cannot be shared), whatever their common ids hold.
    """
    vt, vd = target.vocab_size, draft.vocab_size
    for i in range(min(vt, vd)):
        a, b = target.token_text(i), draft.token_text(i)
        if a != b:
            return VocabularyComparison(False, f"token {i} is {b!r} in the draft and {a!r} in the target")
    if vt != vd:
        return VocabularyComparison(False, f"the draft has {vd:,} tokens and the target {vt:,}")
    bt, bd = getattr(target, "bos_token_id", None), getattr(draft, "bos_token_id", None)
    if bt != bd:
        return VocabularyComparison(False, f"BOS is id {bd} in the draft and {bt} in the target")
    et, ed = set(target.eos_token_ids), set(draft.eos_token_ids)
    if et != ed:
        return VocabularyComparison(False, f"end-of-generation ids are {sorted(ed)[:6]} in the draft and "
                                           f"{sorted(et)[:6]} in the target")
    return VocabularyComparison(True)


@dataclass
class Intersection:
    """The one-to-one map of tokens both vocabularies share (TLI).

    Attributes:
        d2t: int64 ``[V_draft]``: the target id of each draft id, -1 outside the intersection.
        mask: bool ``[V_draft]``: d2t >= 0.
        draft_ids, target_ids: int64 ``[n]``: the pairs, aligned.
    """

    d2t: np.ndarray
    mask: np.ndarray
    draft_ids: np.ndarray
    target_ids: np.ndarray

    @property
    def size(self) -> int:
        return int(self.draft_ids.shape[0])


def _index_by_bytes(table: TokenTable) -> dict[bytes, int]:
    """bytes -> one id per byte string, a regular token preferred to a byte-fallback one (``<0x0A>``)."""
    out: dict[bytes, int] = {}
    for i, p in enumerate(table.pieces):
        if not p:
            continue
        j = out.get(p)
        if j is None or (_BYTE_TOKEN.match(table.backend.token_text(j)) and not _BYTE_TOKEN.match(table.backend.token_text(i))):
            out[p] = i
    return out


def build_intersection(target: TokenTable, draft: TokenTable) -> Intersection:
    """Tokens whose byte strings both vocabularies have, plus control tokens with the same text."""
    t_index = _index_by_bytes(target)
    d_index = _index_by_bytes(draft)
    pairs = [(d, t_index[b]) for b, d in d_index.items() if b in t_index]
    pairs += [(d, target.special[s]) for s, d in draft.special.items() if s in target.special]
    d2t = np.full(len(draft.pieces), -1, dtype=np.int64)
    for d, t in pairs:
        d2t[d] = t
    ids = np.nonzero(d2t >= 0)[0]
    return Intersection(d2t, d2t >= 0, ids, d2t[ids])
