"""One generation's state, advanced by prefill, then propose / verify / commit steps.

Each step (Leviathan et al. 2023, algorithm 1):
  1. the drafter proposes m <= k tokens after the committed context;
  2. the target scores the last committed token and the m draft tokens in one
     forward pass (m+1 rows of logits), several requests sharing the pass;
  3. verification accepts a prefix of the draft and draws one more token (the
     residual sample, or the bonus token when all m are accepted);
  4. the target's cache is rolled back to the accepted prefix (the drafter syncs
     its own cache on its next proposal).

Invariant: the target's cache holds every committed token but the last, which
the next verification pass feeds. Emitted tokens go through one check each, in
order, so output ends right after the first end-of-generation token or stop
string and never exceeds ``max_new_tokens``, however many tokens a step accepts.

:class:`~speculative.engine.SpeculativeGenerator` drives one request at a time;
:mod:`speculative.server.scheduler` drives many through the same three calls
(:meth:`DecodeRequest.propose`, :meth:`DecodeRequest.verify_request`,
:meth:`DecodeRequest.commit`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .backends.base import ForwardRequest
from .config import GenerationConfig
from .constraints import Constraint, apply_masks
from .cost_model import CostModel, drafting_gain_per_token
from .drafters.base import DraftProposal, NoDrafter
from .errors import ConfigError
from .output import GenerationResult, OutputText, TokenLogprob
from .selection import chain_length, layout_tree, limit_depth, tree_nodes
from .stats import GenerationStats
from .trees import children as tree_children
from .trees import depths as tree_depths
from .trees import path_to
from .verification import rejection_sample, tree_rejection_sample, verify_greedy, verify_tree_greedy

if TYPE_CHECKING:
    from .engine import SpeculativeGenerator


class DecodeRequest:
    """The state of one generation, advanced by prefill, then propose / verify / commit steps.

    Args:
        gen: the generator (target, drafter, cost model).
        prompt_ids: the prompt's token ids.
        cfg: a validated :class:`GenerationConfig`.
        messages: the chat messages ``prompt_ids`` were rendered from, if any (a drafter with
            another tokenizer renders them with its own template).
    """

    def __init__(self, gen: SpeculativeGenerator, prompt_ids: Sequence[int], cfg: GenerationConfig,
                 messages: Sequence[dict] | None = None):
        self.gen = gen
        self.messages = list(messages) if messages else None  # chat messages the prompt was rendered from
        self.target = gen.target
        self.drafter = gen.drafter if cfg.speculative else NoDrafter()
        self.cfg = cfg
        self.prompt_ids = list(prompt_ids)
        self.target.check_prompt_fits(len(self.prompt_ids))  # ContextOverflowError: no room for a new token
        self.sampler = gen.make_sampler(cfg, len(self.prompt_ids))
        self.rng = np.random.default_rng(cfg.sampling.seed)
        self.k = cfg.num_speculative_tokens
        self.eos = self.target.eos_token_ids if cfg.stop_at_eos else frozenset()
        self.stats = GenerationStats(num_speculative_tokens=self.k, prompt_tokens=len(self.prompt_ids))
        self.out: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if cfg.logprobs is not None else None
        self.text = OutputText(self.target, cfg.stop)
        self.context: list[int] = []
        self.finish_reason: str | None = None
        self.seq: int | None = None
        self.dstate = None
        plain = isinstance(self.drafter, NoDrafter)
        self.cost: CostModel | None = gen.cost_model if (cfg.draft_policy == "adaptive" and not plain) else None
        # seconds per draft token: the drafter's measured estimate, refined by this request's proposals
        self.draft_cost_per_token = (self.drafter.draft_cost_estimate() or 0.0) if self.cost is not None else 0.0
        if self.cost is not None:
            self.drafter.begin_request()  # a drafter silenced by a negative measured saving is measured afresh now and then
        #: a request that starts with its drafter silenced decodes plainly: no drafter state, no hidden
        #: states from the target, no proposals (the drafter costs nothing in it)
        self.silent = self.cost is not None and self.drafter.silenced
        self._hidden = self.drafter.needs_hidden and not self.silent
        self._t0 = 0.0
        self._target_t0 = 0.0
        self._proposal: DraftProposal | None = None
        self._draft: list[int] = []
        self._tree: tuple[list[int], list[int], list[int]] | None = None
        self._pending = 1
        self._n_cached = 0
        self._t_verify = 0.0
        self._draft_s = 0.0  # seconds the drafter ran for the current step's proposal
        self._saving_skip = 0  # steps left to decode plainly after proposals that did not pay
        self._saving_misses = 0
        self._released = False
        #: the output's constraint (JSON, schema, regex, grammar): its matcher holds the committed output
        self.constraint = Constraint.compile(cfg.constraint, self.target) if cfg.constraint is not None else None
        self._masks = None  # constraint masks along the current draft (chain: [n+1, V]; tree: (root, per node))
        self._cut: tuple[int, np.ndarray] | None = None  # a forbidden draft token cut off, and its q row
        self.constraint_cut_tokens = 0  # draft tokens the constraint cut before verification

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    # ---- prefill --------------------------------------------------------------------

    def prefill(self) -> list[int]:
        """Take a sequence (reusing a cached prefix), run the prompt, emit the first token."""
        perf = time.perf_counter
        self._t0 = t0 = perf()
        self._target_t0 = self.target.forward_time_s
        target = self.target
        self.seq = target.allocate_sequence(self.prompt_ids)
        kept = target.reuse_prefix(self.seq, self.prompt_ids, keep_last=1)
        self.stats.cached_prompt_tokens = kept
        L = len(self.prompt_ids)
        if self._hidden:
            # the drafter reads the target's hidden states of the last `hidden_window` prompt tokens
            split = max(kept, L - self.drafter.hidden_window)
            if split > kept:
                target.forward([ForwardRequest(self.seq, self.prompt_ids[kept:split], logits="none")])
            out = target.forward([ForwardRequest(self.seq, self.prompt_ids[split:], logits="all", hidden=True,
                                                 hidden_layers=self.drafter.hidden_layers)])[0]
            logits = out.logits
            self.dstate = self.drafter.start_request(self.prompt_ids, self.messages)
            self.drafter.observe_hidden(self.dstate, split, out.hidden)
        else:
            logits = target.forward([ForwardRequest(self.seq, self.prompt_ids[kept:], logits="last")])[0].logits
            if not self.silent:  # a silenced drafter keeps no state in this request
                self.dstate = self.drafter.start_request(self.prompt_ids, self.messages)
        self.context = list(self.prompt_ids)
        rows = logits[-1:]
        if self.sampler.uses_history:
            rows = self.sampler.adjust(rows, self.context, ())
        if self.constraint is not None:
            rows = apply_masks(rows, self.constraint.mask()[None])
        first, _ = self.sampler.sample(rows[0], self.rng)
        self.stats.steps = 1
        self.stats.prefill_time_s = perf() - t0
        new = self._emit([first], rows)
        self.stats.wall_time_s = perf() - t0
        return new

    # ---- one step -------------------------------------------------------------------

    def budget(self) -> int:
        """Most draft tokens this step may verify (k, the tokens left, the context window)."""
        room = self.target.n_ctx - len(self.context) - 1  # prompt + output never exceed the window
        return max(0, min(self.k, self.cfg.max_new_tokens - len(self.out) - 1, room))

    def rate(self) -> float:
        """Long-run tokens/s this request achieves (at least plain decoding's 1/T(1))."""
        t1 = self.cost.time(1)
        decode_s = self.stats.wall_time_s - self.stats.prefill_time_s
        return max(1.0 / t1, (len(self.out) - 1) / decode_s if decode_s > 0 else 0.0)

    def propose(self) -> DraftProposal:
        """Ask the drafter for this step's draft (up to :meth:`budget` tokens)."""
        if len(self.context) >= self.target.n_ctx:
            self._finish("length")  # the context window is full
            return DraftProposal()
        m_max = self.budget()
        td = time.perf_counter()
        model_t0 = self.drafter.model_time_s()
        min_conf = 0.0
        if self.cost is not None:
            t1 = self.cost.time(1)
            min_conf = self.rate() * ((self.cost.time(self.k + 1) - t1) / self.k + self.draft_cost_per_token)
            if self.silent:
                m_max = 0  # silenced for this request (see __init__)
            if m_max > 0 and not self.drafting_can_pay(m_max):
                m_max = 0  # not even a perfectly accepted draft would pay: do not run the drafter
            if m_max > 0 and not self.afford_catchup():
                m_max = 0  # bringing the drafter up to the context would cost more than drafting saves
            if m_max > 0 and self._saving_skip > 0:
                self._saving_skip -= 1
                m_max = 0  # recent proposals cost more than they saved: back off
        if m_max > 0:
            guide = self.constraint.guide() if self.constraint is not None and self.drafter.steerable else None
            try:
                p = self.drafter.propose(self.dstate, self.context, m_max, self.sampler, self.rng,
                                         min_confidence=min_conf, **({"guide": guide} if guide else {}))
            finally:
                if guide is not None:
                    guide.release()
        else:
            p = DraftProposal()
        dt = time.perf_counter() - td
        self._draft_s = dt if p.tokens else 0.0  # a step counts as drafted when there was a draft
        self.stats.draft_time_s += dt
        self.stats.draft_forward_time_s += self.drafter.model_time_s() - model_t0
        if p.tokens:
            per_token = max(dt - p.catchup_s, 0.0) / min(len(p.tokens), m_max)
            self.draft_cost_per_token += 0.1 * (per_token - self.draft_cost_per_token)
        if p.parents is None:
            p.tokens = [int(t) for t in p.tokens[:m_max]]
        else:
            p = limit_depth(p, m_max)
        if self.constraint is not None:
            p = self._constrain(p)
        self._proposal = p
        return p

    def drafting_can_pay(self, m_max: int) -> bool:
        """Whether drafting could beat plain decoding this step even if every draft token were accepted.

        With the measured verification cost T(n), the drafter's cost per token t_d and the
        request's rate r (tokens/s, at least 1/T(1)), m perfectly accepted draft tokens score
        (m + 1) - r·(m·t_d + T(m + 1)) against plain decoding's 1 - r·T(1) (the renewal-reward
        form of :func:`~speculative.cost_model.choose_draft_length`, with the drafter's cost added).
        When no m <= ``m_max`` wins, the step decodes plainly without running the drafter, so a
        drafter that costs a large share of a target step (a same-family draft model on a
        compute-bound CPU) costs nothing; on hardware where T(n) is flat the same test drafts.
        """
        cost, rate, td = self.cost, self.rate(), self.draft_cost_per_token
        base = 1.0 - rate * cost.time(1)
        return any((m + 1) - rate * (m * td + cost.time(m + 1)) > base for m in range(1, m_max + 1))

    def afford_catchup(self) -> bool:
        """Before a draft that needs the drafter to catch up on many tokens (a draft model's lazy prompt
        prefill): whether, and on how much of the context, catching up pays now.

        Drafting saves g seconds per generated token (:func:`~speculative.cost_model.drafting_gain_per_token`
        at the drafter's measured acceptance rate and draft cost and the target's T(n), and at most what
        its recent drafted steps measurably saved per token: the acceptance of the drafts the policy
        chose to verify flatters the drafter; a negative measurement, which silences the drafter, is
        taken afresh now and then: :meth:`~speculative.drafters.base.Drafter.begin_request`); catching up
        costs t_c per token (the drafter's measured rate; before its first catch-up, the target's
        measured prefill rate scaled by the two models' T(1)). The context the drafter reads is capped
        at the last R·g/(2·t_c) tokens, R being the tokens left in the budget (drafts stay verified,
        so the output is unchanged); fewer than 64: no drafting. The answer's length is unknown, so
        the catch-up is bought as in ski rental (Karlin et al. 1988): decode plainly until drafting
        would already have saved its cost, i.e. until (tokens generated)·g >= (window)·t_c, which
        loses at most twice what knowing the length in advance would (a short answer never pays
        for a long prompt).
        """
        d = self.drafter
        n = d.catchup_tokens(self.dstate, self.context)
        if n <= 0:
            return True
        t_c = d.catchup_cost_per_token()
        if t_c is None:
            t1 = self.cost.time(1)
            fresh = self.stats.prompt_tokens - self.stats.cached_prompt_tokens
            target_rate = self.stats.prefill_time_s / fresh if fresh >= 32 else self.cost.time(16) / 16
            t_c = target_rate * min(1.0, (d.draft_cost_estimate() or t1) / t1)
        g = drafting_gain_per_token(d.acceptance_rate, self.draft_cost_per_token, self.cost, self.k)
        real = d.measured_saving_per_token()
        if real is not None:
            g = min(g, max(0.0, real))  # alpha of verified drafts flatters: what drafting really saved
        left = self.cfg.max_new_tokens - len(self.out)
        window = min(n, int(left * g / (2.0 * t_c))) if t_c > 0 else n
        if window < min(n, 64) or len(self.out) * g < window * t_c:
            return False
        if window < n:
            d.limit_context(self.dstate, self.context, window)
        return True

    def _observe_saving(self, accepted: int, forward_s: float | None) -> None:
        """After a step whose proposal the drafter ran for: the time it saved, measured.

        Net saving = accepted·T(1) - (drafting time + the verification's cost beyond T(1)); the drafter
        keeps its average (:meth:`~speculative.drafters.base.Drafter.observe_saving`). While that
        average is negative, drafting backs off: the next 1, 2, 4, ... (at most 32) steps decode
        plainly, each probe after a back-off doubling it, a paying one resetting it. This catches what
        the per-token estimates miss (first draft tokens worth too little for a drafter that costs
        half a target step, the drafter's own overheads), from measured times only.
        """
        if self.cost is None or self._draft_s <= 0.0 or forward_s is None:
            return
        t1 = self.cost.time(1)
        avg = self.drafter.observe_saving(accepted * t1 - self._draft_s - max(0.0, forward_s - t1), accepted + 1)
        self._draft_s = 0.0
        if avg < 0.0:
            self._saving_misses += 1
            self._saving_skip = min(2 ** (self._saving_misses - 1), 32)
        else:
            self._saving_misses = 0

    def _constrain(self, p: DraftProposal) -> DraftProposal:
        """The proposal without what the constraint forbids; the masks at the positions left go to ``_masks``.

        A chain is cut at its first forbidden token (kept in ``_cut`` with its q row when the drafter
        sampled it, see :meth:`commit`) or after a token that completes the grammar. A tree loses
        the nodes whose path the constraint forbids (deterministic siblings only: for them a
        forbidden candidate changes nothing, since its masked p is already 0).
        """
        c = self.constraint
        self._cut = None
        if p.parents is None:
            n, masks, forbidden = c.chain_masks(p.tokens)
            self._masks = masks
            if n == len(p.tokens):
                return p
            self.constraint_cut_tokens += len(p.tokens) - n
            if forbidden and p.probs is not None:
                self._cut = (int(p.tokens[n]), p.probs[n])
            return replace(p, tokens=list(p.tokens[:n]), probs=p.probs[:n] if p.probs is not None else None,
                           confidence=list(p.confidence[:n]) if p.confidence is not None else None)
        if p.probs is not None:
            raise ConfigError("a token tree of sampled siblings cannot be verified under a constraint: "
                              "use a chain drafter (no tree=...)")
        keep, root, node_masks = c.tree_masks(p.tokens, p.parents)
        if len(keep) != len(p.tokens):
            self.constraint_cut_tokens += len(p.tokens) - len(keep)
            new = {old: i for i, old in enumerate(keep)}
            p = replace(p, tokens=[p.tokens[i] for i in keep],
                        confidence=[p.confidence[i] for i in keep] if p.confidence is not None else None,
                        parents=[-1 if p.parents[i] < 0 else new[p.parents[i]] for i in keep])
        self._masks = (root, node_masks)
        return p

    def choose_length(self, proposal: DraftProposal, cost: CostModel | None = None, rate: float | None = None) -> int:
        """Chain drafts: how many leading tokens to verify (:func:`~speculative.selection.chain_length`)."""
        cost = cost or self.cost
        return chain_length(proposal, cost, (rate or self.rate()) if cost is not None else 0.0)

    def choose_nodes(self, proposal: DraftProposal, cost: CostModel | None = None, rate: float | None = None) -> list[int]:
        """Tree drafts: the nodes to verify (:func:`~speculative.selection.tree_nodes`)."""
        cost = cost or self.cost
        return tree_nodes(proposal, cost, (rate or self.rate()) if cost is not None else 0.0,
                          spine_only=self.target.tree_spine_only, max_leaves=getattr(self.target, "tree_width", 0))

    def choose(self, proposal: DraftProposal) -> int | list[int]:
        """What to verify of a proposal: a chain length, or tree node indices."""
        if proposal.parents is None:
            return self.choose_length(proposal)
        return self.choose_nodes(proposal)

    def verify_request(self, selection: int | list[int]) -> ForwardRequest:
        """The target forward of this step.

        It feeds the committed tokens not yet cached (normally just the last one)
        and the draft: the first ``selection`` tokens of a chain, or the tree nodes
        ``selection``, laid out spine first. Logits come back for the last committed
        token and every draft token.
        """
        prop = self._proposal if self._proposal is not None else DraftProposal()
        n_cached = len(self.target.cached_tokens(self.seq))
        pending = self.context[n_cached:]
        P = len(pending)
        self._pending = P
        self._t_verify = time.perf_counter()
        self._n_cached = n_cached
        hidden = self._hidden
        if prop.parents is None:
            self._tree = None
            self._draft = prop.tokens[: int(selection)]
            first = 0 if hidden else P - 1  # hidden states of every fed token go to the drafter
            return ForwardRequest(self.seq, pending + self._draft, logits=list(range(first, P + len(self._draft))),
                                  hidden=hidden, hidden_layers=self.drafter.hidden_layers)
        toks, parents, orig = layout_tree(prop, selection, spine_only=self.target.tree_spine_only)
        self._tree = (toks, parents, orig)
        self._draft = toks
        chain = list(range(-1, P - 1))
        tree_parents = chain + [(P - 1) if p < 0 else P + p for p in parents]
        rows = ([*range(P - 1)] if hidden else []) + [P - 1] + [P + i for i in range(len(toks))]
        return ForwardRequest(self.seq, pending + toks, logits=rows, tree_parents=tree_parents, hidden=hidden,
                              hidden_layers=self.drafter.hidden_layers)

    def commit(self, logits: np.ndarray, forward_s: float | None = None, hidden: np.ndarray | None = None) -> list[int]:
        """Verify the draft against the target's logits (last committed token, then each draft token),
        roll back, emit tokens. ``hidden``: the forward's hidden states, for drafters that read them."""
        lead = self._pending - 1 if self._hidden else 0
        if lead:
            hidden_all, logits = hidden, logits[lead:]
        else:
            hidden_all = hidden
        if self._tree is not None:
            return self._commit_tree(logits, forward_s, hidden_all)
        draft, proposal, sampler = self._draft, self._proposal, self.sampler
        if self.cost is not None and forward_s is not None:
            self.cost.update(len(draft) + self._pending, forward_s)
        if sampler.uses_history:
            logits = sampler.adjust(logits, self.context, draft)
        if self.constraint is not None:
            logits = apply_masks(logits, self._masks[: len(draft) + 1])
        if sampler.greedy:
            res = verify_greedy(sampler.argmax(logits), draft)
        else:
            q = proposal.probs[: len(draft)] if proposal is not None and proposal.probs is not None else None
            verified = draft
            if self._cut is not None and q is not None and len(draft) == len(proposal.tokens):
                # the forbidden token cut off after the draft was sampled from q: it is rejected
                # (masked p = 0), so its position draws from the residual norm(max(0, p - q)), not p
                verified = list(draft) + [self._cut[0]]
                q = np.concatenate([q, self._cut[1][None]])
            res = rejection_sample(lambda i: sampler.probs(logits[i]), verified, q, self.rng)
        self.target.truncate(self.seq, len(self.context) + res.num_accepted)
        self.stats.record_step(len(draft), res.num_accepted)
        self.drafter.observe_verification(len(draft), res.num_accepted)
        self._observe_saving(res.num_accepted, forward_s)
        if self._hidden and hidden_all is not None:
            # fed tokens: the pending ones and the accepted draft tokens, at consecutive positions
            self.drafter.observe_hidden(self.dstate, self._n_cached, hidden_all[: self._pending + res.num_accepted])
        return self._finish_step(draft[: res.num_accepted] + [res.next_token], logits)

    def _commit_tree(self, logits: np.ndarray, forward_s: float | None, hidden: np.ndarray | None = None) -> list[int]:
        toks, parents, orig = self._tree
        prop, sampler = self._proposal, self.sampler
        if self.cost is not None and forward_s is not None:
            self.cost.update(len(toks) + self._pending, forward_s)
        ctx = self.context
        rows: dict[int, np.ndarray] = {}

        def row(u: int) -> np.ndarray:  # adjusted logits at node u (-1: the last committed token)
            if u not in rows:
                r = logits[u + 1]
                if sampler.uses_history:
                    hist = ctx + [toks[i] for i in path_to(parents, u)] if u >= 0 else ctx
                    r = sampler.adjust(r[None], hist, ())[0]
                if self.constraint is not None:
                    root_mask, node_masks = self._masks
                    r = apply_masks(r[None], (root_mask if u < 0 else node_masks[orig[u]])[None])[0]
                rows[u] = r
            return rows[u]

        if sampler.greedy:
            res = verify_tree_greedy(lambda u: int(np.argmax(row(u))), toks, parents)
        else:
            kids = tree_children(parents)
            child_probs = None
            if prop.probs is not None:
                def child_probs(u):
                    return prop.probs[orig[kids[u][0]]] if kids[u] else None
            res = tree_rejection_sample(lambda u: sampler.probs(row(u)), toks, parents, child_probs, self.rng)
        P = self._pending
        kept = self.target.commit_path(self.seq, list(range(P)) + [P + i for i in res.path])
        if self._hidden and hidden is not None:
            idx = (list(range(P)) + [P + i for i in res.path])[:kept]
            self.drafter.observe_hidden(self.dstate, self._n_cached, hidden[idx])
        depth = max(tree_depths(parents), default=0)
        self.stats.record_tree_step(len(toks), depth, len(res.path))
        self.drafter.observe_verification(depth, len(res.path))
        self._observe_saving(len(res.path), forward_s)
        emitted = [toks[i] for i in res.path] + [res.next_token]
        emit_rows = [row(-1)] + [row(i) for i in res.path]
        return self._finish_step(emitted, emit_rows)

    def _finish_step(self, tokens: list[int], rows) -> list[int]:
        new = self._emit(tokens, rows)
        now = time.perf_counter()
        self.stats.verify_time_s += now - self._t_verify
        self.stats.wall_time_s = now - self._t0
        self.stats.target_forward_time_s = self.target.forward_time_s - self._target_t0
        return new

    # ---- emission and the end -----------------------------------------------------------

    def _emit(self, tokens: Sequence[int], rows: np.ndarray) -> list[int]:
        """Commit tokens one by one, stopping at EOS, a stop string, max_new_tokens or the end of
        the context window (prompt + output = n_ctx)."""
        new: list[int] = []
        for j, t in enumerate(tokens):
            t = int(t)
            new.append(t)
            self.out.append(t)
            self.context.append(t)
            if self.constraint is not None:
                self.constraint.consume(t)
            if self.logprobs is not None:
                self.logprobs.append(self._logprob(rows[j], t))
            is_eos = t in self.eos
            if is_eos:
                self.text.push(t, render=False)
                self._finish("stop")
                break
            if self.text.push(t, check=len(self.out) >= self.cfg.min_tokens):
                self._finish("stop")
                break
            if self.constraint is not None and self.constraint.stopped:
                self._finish("stop")  # the output is complete: the grammar allows nothing more
                break
            if len(self.out) >= self.cfg.max_new_tokens or len(self.context) >= self.target.n_ctx:
                self._finish("length")  # max_new_tokens, or the context window is full
                break
        self.stats.new_tokens = len(self.out)
        return new

    def _logprob(self, row: np.ndarray, token: int) -> TokenLogprob:
        lp = self.sampler.logprobs(row)
        n = self.cfg.logprobs or 0
        top: list[tuple[int, float]] = []
        if n:
            idx = np.argpartition(-lp, n - 1)[:n] if n < lp.shape[0] else np.arange(lp.shape[0])
            idx = idx[np.lexsort((idx, -lp[idx]))]
            top = [(int(i), float(lp[i])) for i in idx if np.isfinite(lp[i])]  # not tokens ruled out (-inf)
        return TokenLogprob(token, float(lp[token]), top)

    def _finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def release(self) -> None:
        """Free the sequence (its cache stays for prefix reuse) and the drafter state."""
        self.stats.wall_time_s = time.perf_counter() - self._t0
        self.stats.target_forward_time_s = self.target.forward_time_s - self._target_t0
        if self.cost is not None and not self._released:
            self._released = True
            self.drafter.end_request(self.stats.wall_time_s - self.stats.prefill_time_s, self.stats.draft_tokens > 0)
            self.cost.save_if_drifted()
        if self.dstate is not None:
            self.drafter.finish(self.dstate)
            self.dstate = None
        if self.seq is not None:
            self.target.release_sequence(self.seq)
            self.seq = None
        if self.finish_reason is None:
            self.finish_reason = "length"

    def result(self) -> GenerationResult:
        return GenerationResult(
            text=self.text.finish(),
            token_ids=list(self.out),
            finish_reason=self.finish_reason or "length",
            stats=self.stats,
            prompt_token_ids=self.prompt_ids,
            logprobs=self.logprobs,
        )


class Generation:
    """A running generation. Iterate it for text pieces, or :meth:`blocks` for the
    token ids each step emitted; ``result`` is set once it ends.

    Text pieces withhold what may still start a stop string or is an incomplete
    UTF-8 character, so they concatenate to ``result.text``. Closing the
    generation early (``close()``, or dropping it) frees the target's sequence.
    """

    def __init__(self, steps: Iterator[list[int]], request: DecodeRequest):
        self._steps = steps
        self._req = request
        self._sent = 0
        self.result: GenerationResult | None = None

    def blocks(self) -> Iterator[list[int]]:
        """Token ids emitted by each step (1..k+1 per step, cut at EOS / stop / max_new_tokens)."""
        yield from self._steps
        self.result = self._req.result()

    def __iter__(self) -> Iterator[str]:
        for _ in self._steps:
            piece = self._next_piece()
            if piece:
                yield piece
        self.result = self._req.result()
        tail = self.result.text[self._sent :]
        if tail:
            yield tail

    def _next_piece(self) -> str:
        text = self._req.text.streamable()
        piece = text[self._sent :]
        self._sent = len(text)
        return piece

    def close(self) -> None:
        self._steps.close()
