"""One generation: its state, the prefill, and the speculative step (propose → verify → accept →
commit → emit) for chains and token trees.

Each step (Leviathan et al. 2023, algorithm 1):
  1. propose: the drafter proposes m <= k tokens after the committed context, as many as the
     adaptive policy allows (:mod:`speculative.policy`; 0: a plain step);
  2. verify: the target scores the last committed token and the chosen draft tokens in one forward
     pass (m+1 rows of logits; a token tree is laid out spine first under a tree mask);
  3. accept: verification accepts a prefix (a tree: a path) of the draft and draws one more token,
     the residual sample or the bonus token (:mod:`speculative.verification`);
  4. commit: the target's cache keeps the accepted tokens only; the drafter brings its own state up
     to the context at its next proposal (and is handed the target's hidden states, if it reads them);
  5. emit: the new tokens go through one check each, in order, so output ends right after the first
     end-of-generation token or stop string and never exceeds ``max_new_tokens``.

Invariant: the target's cache holds every committed token but the last, which the next verification
pass feeds. :meth:`DecodeRequest.step` runs one step for one request;
:mod:`speculative.server.scheduler` runs the same three phases (:meth:`DecodeRequest.propose`,
:meth:`DecodeRequest.verify_request`, :meth:`DecodeRequest.commit`) for many requests, with one
batched target forward between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .backends.base import Backend, ForwardRequest, ForwardResult
from .config import GenerationConfig
from .constraints import Constraint, apply_masks
from .cost_model import CostModel
from .drafters.base import DraftProposal, Drafter, DraftState, NoDrafter
from .errors import ConfigError
from .output import GenerationResult, OutputText, TokenLogprob
from .policy import DraftPolicy, PolicyState
from .sampling import Sampler
from .selection import layout_tree, limit_to_budget
from .stats import GenerationStats
from .trees import children as tree_children
from .trees import depths as tree_depths
from .trees import path_to
from .trees import spine as tree_spine
from .verification import rejection_sample, tree_rejection_sample, verify_greedy, verify_tree_greedy


@dataclass
class Draft:
    """One step's draft, from its proposal to its verification.

    Attributes:
        proposal: the drafter's proposal, cut to the step's budget and by the output constraint.
        masks: the constraint's masks along the draft: a chain's bool ``[n+1, V]``, a tree's
            (root mask ``[V]``, one per node); None when the output is unconstrained.
        cut: a sampled chain token the constraint forbade, and the q row it was drawn from (it is
            verified as rejected, see :meth:`DecodeRequest.commit`); None otherwise.
        tokens: the draft tokens fed to the target: a chain's first tokens, or the chosen tree nodes
            laid out spine first (set by :meth:`DecodeRequest.verify_request`).
        parents: the laid-out tree's parents (-1: the last committed token); None for a chain.
        nodes: each laid-out tree token's index in ``proposal``; None for a chain.
        pending: committed tokens fed before the draft (normally 1, the last committed token).
        cached: how many tokens the target's cache held when the forward was built.
        verify_started_at: ``time.perf_counter()`` when the forward was built.
    """

    proposal: DraftProposal
    masks: object = None
    cut: tuple[int, np.ndarray] | None = None
    tokens: list[int] = field(default_factory=list)
    parents: list[int] | None = None
    nodes: list[int] | None = None
    pending: int = 1
    cached: int = 0
    verify_started_at: float = 0.0


@dataclass(eq=False)
class DecodeRequest:
    """The state of one generation (see the module docstring for the step).

    Make one with :meth:`open` (or :meth:`~speculative.engine.SpeculativeGenerator.new_request`).

    Attributes:
        target: the target model's backend.
        drafter: the drafter (:class:`~speculative.drafters.base.NoDrafter` for a plain request).
        policy: the drafter's adaptive policy for the request's tenant (kept across its requests); ``plan``:
            this request's state in it.
        cfg: the validated :class:`~speculative.config.GenerationConfig`.
        sampler: the request's logits processing and sampling; ``rng``: its random generator.
        constraint: the output's constraint (JSON, schema, regex, grammar), its matcher at the committed
            output; None when unconstrained.
        prompt_ids: the prompt's token ids; ``messages``: the chat messages they were rendered from, if
            any (a drafter with another tokenizer renders them with its own template).
        context: every committed token id (prompt + output).
        out: the output token ids.
        logprobs: one :class:`~speculative.output.TokenLogprob` per output token, when asked for.
        text: the output text (incremental detokenization, stop strings).
        eos: the end-of-generation ids that stop the output (empty when ``stop_at_eos`` is off).
        finish_reason: None while running, then "stop" or "length".
        seq: the target's sequence (its KV cache) while the request holds one.
        draft_state: the drafter's state for this request (None when it sits the request out).
        reads_hidden: the target returns hidden states for the drafter (a head that is not silenced).
        stats: timings and counts (:class:`~speculative.stats.GenerationStats`).
        constraint_cut_tokens: draft tokens the constraint cut before verification.
        started_at, target_time_at_start: ``time.perf_counter()`` and the target's forward time when
            the prefill started.
        released: :meth:`release` has run.
    """

    target: Backend
    drafter: Drafter
    policy: DraftPolicy
    plan: PolicyState
    cfg: GenerationConfig
    sampler: Sampler
    rng: np.random.Generator
    constraint: Constraint | None
    prompt_ids: list[int]
    messages: list[dict] | None
    text: OutputText
    eos: frozenset
    stats: GenerationStats
    context: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    seq: int | None = None
    draft_state: DraftState | None = None
    reads_hidden: bool = False
    constraint_cut_tokens: int = 0
    started_at: float = 0.0
    target_time_at_start: float = 0.0
    released: bool = False

    @classmethod
    def open(cls, target: Backend, drafter: Drafter, policy: DraftPolicy, cost: Callable[[], CostModel],
             prompt_ids: Sequence[int], cfg: GenerationConfig, sampler: Sampler,
             messages: Sequence[dict] | None = None) -> DecodeRequest:
        """A request (not started) for ``prompt_ids`` under ``cfg``.

        Args:
            drafter, policy: the generator's drafter and its policy (ignored when ``cfg.speculative`` is
                off: the request decodes plainly).
            cost: returns the target's T(n); called only under the adaptive policy (measuring it takes
                about a second, once per machine).

        Raises:
            ContextOverflowError: the prompt leaves no room for a new token.
            ConfigError: a constraint that does not compile.
        """
        target.check_prompt_fits(len(prompt_ids))
        if not cfg.speculative or isinstance(drafter, NoDrafter):
            drafter = NoDrafter()
            policy = DraftPolicy(drafter)  # a plain request leaves the drafter's measurements alone
        adaptive = cfg.draft_policy == "adaptive" and not isinstance(drafter, NoDrafter)
        plan = policy.begin_request(cost() if adaptive else None, cfg.num_speculative_tokens, cfg.max_new_tokens)
        return cls(
            target=target, drafter=drafter, policy=policy, plan=plan, cfg=cfg, sampler=sampler,
            rng=np.random.default_rng(cfg.sampling.seed),
            constraint=Constraint.compile(cfg.constraint, target) if cfg.constraint is not None else None,
            prompt_ids=list(prompt_ids), messages=list(messages) if messages else None,
            text=OutputText(target, cfg.stop), eos=target.eos_token_ids if cfg.stop_at_eos else frozenset(),
            stats=GenerationStats(num_speculative_tokens=cfg.num_speculative_tokens, prompt_tokens=len(prompt_ids)),
            logprobs=[] if cfg.logprobs is not None else None,
            reads_hidden=drafter.needs_hidden and not plan.silent,
        )

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    # ---- prefill --------------------------------------------------------------------------------

    def prefill(self) -> list[int]:
        """Take a sequence (reusing a cached prefix), run the prompt, emit the first token."""
        self.started_at = t0 = time.perf_counter()
        self.target_time_at_start = self.target.forward_time_s
        target, prompt = self.target, self.prompt_ids
        self.seq = target.allocate_sequence(prompt)
        kept = target.reuse_prefix(self.seq, prompt, keep_last=1)
        self.stats.cached_prompt_tokens = kept
        if self.reads_hidden:
            # the drafter reads the target's hidden states of the last `hidden_window` prompt tokens
            split = max(kept, len(prompt) - self.drafter.hidden_window)
            if split > kept:
                target.forward([ForwardRequest(self.seq, prompt[kept:split], logits="none")])
            out = target.forward([ForwardRequest(self.seq, prompt[split:], logits="all", hidden=True,
                                                 hidden_layers=self.drafter.hidden_layers)])[0]
            logits = out.logits
            self.draft_state = self.drafter.start(prompt, self.messages, tenant=self.cfg.tenant)
            self.drafter.observe_hidden(self.draft_state, split, out.hidden)
        else:
            logits = target.forward([ForwardRequest(self.seq, prompt[kept:], logits="last")])[0].logits
            if not self.plan.silent:  # a drafter sitting the request out keeps no state in it
                self.draft_state = self.drafter.start(prompt, self.messages, tenant=self.cfg.tenant)
        self.context = list(prompt)
        rows = logits[-1:]
        if self.sampler.uses_history:
            rows = self.sampler.adjust(rows, self.context, ())
        if self.constraint is not None:
            rows = apply_masks(rows, self.constraint.mask()[None])
        first, _ = self.sampler.sample(rows[0], self.rng)
        self.stats.steps = 1
        self.stats.prefill_time_s = time.perf_counter() - t0
        new = self._emit([first], rows)
        self.stats.wall_time_s = time.perf_counter() - t0
        return new

    # ---- one step: propose → verify → accept → commit → emit ----------------------------------------

    def step(self, forward: Callable[[list[ForwardRequest]], list[ForwardResult]]) -> list[int]:
        """One speculative step of this request alone: propose, verify in one target ``forward`` (timed,
        for the policy), accept, commit, emit. Returns the emitted tokens ([] once the request is done)."""
        draft = self.propose()
        if self.done:
            return []
        fwd = self.verify_request(draft, self.choose(draft.proposal))
        t0 = time.perf_counter()
        out = forward([fwd])[0]
        return self.commit(draft, out, time.perf_counter() - t0)

    def propose(self) -> Draft:
        """Propose: the drafter's draft after the context, as long as the policy allows (0: a plain step)."""
        if len(self.context) >= self.target.n_ctx:
            self._finish("length")  # the context window is full
            return Draft(DraftProposal())
        budget = self.policy.draft_budget(self.plan, self.budget(), self.stats, self.draft_state, self.context)
        min_conf = self.policy.min_confidence(self.plan, self.stats)
        t0, model_t0 = time.perf_counter(), self._draft_model_time()
        proposal = DraftProposal()
        if budget > 0:
            guide = self.constraint.guide() if self.constraint is not None and self.drafter.steerable else None
            try:
                proposal = self.drafter.propose(self.draft_state, self.context, budget, self.sampler, self.rng,
                                                min_confidence=min_conf, guide=guide)
            finally:
                if guide is not None:
                    guide.release()
        seconds = time.perf_counter() - t0
        self.stats.draft_time_s += seconds
        self.stats.draft_forward_time_s += self._draft_model_time() - model_t0
        self.policy.observe_proposal(self.plan, proposal, seconds, budget, min_conf)
        if proposal.source and proposal.tokens:
            self.stats.drafter_steps[proposal.source] = self.stats.drafter_steps.get(proposal.source, 0) + 1
        return self._constrain(limit_to_budget(proposal, budget))

    def choose(self, proposal: DraftProposal) -> int | list[int]:
        """What to verify of a proposal: a chain's length or a tree's nodes (the policy's choice)."""
        return self.policy.choose(self.plan, proposal, self.stats, spine_only=self.target.tree_spine_only,
                                  max_leaves=getattr(self.target, "tree_width", 0))

    def verify_request(self, draft: Draft, selection: int | list[int]) -> ForwardRequest:
        """Verify: the target forward of this step. It feeds the committed tokens not yet cached (normally
        just the last one) and the draft: the first ``selection`` tokens of a chain, or the tree nodes
        ``selection`` laid out spine first. Logits come back for the last committed token and every
        draft token (and hidden states of every fed token, for a drafter that reads them)."""
        draft.cached = len(self.target.cached_tokens(self.seq))
        pending = self.context[draft.cached :]
        P = draft.pending = len(pending)
        draft.verify_started_at = time.perf_counter()
        hidden, layers = self.reads_hidden, self.drafter.hidden_layers
        if draft.proposal.parents is None:
            draft.tokens = draft.proposal.tokens[: int(selection)]
            first = 0 if hidden else P - 1
            return ForwardRequest(self.seq, pending + draft.tokens, logits=list(range(first, P + len(draft.tokens))),
                                  hidden=hidden, hidden_layers=layers)
        draft.tokens, draft.parents, draft.nodes = layout_tree(draft.proposal, selection,
                                                               spine_only=self.target.tree_spine_only)
        tree_parents = list(range(-1, P - 1)) + [(P - 1) if p < 0 else P + p for p in draft.parents]
        rows = ([*range(P - 1)] if hidden else []) + [P - 1] + [P + i for i in range(len(draft.tokens))]
        return ForwardRequest(self.seq, pending + draft.tokens, logits=rows, tree_parents=tree_parents,
                              hidden=hidden, hidden_layers=layers)

    def commit(self, draft: Draft, out: ForwardResult, forward_s: float | None = None) -> list[int]:
        """Accept, commit, emit: verify the draft against the forward's output (``forward_s``: its seconds
        when it ran for this request alone, None in a batch), keep the accepted tokens in the target's
        cache, tell the policy and the drafter, and emit the accepted tokens and the next one."""
        logits = out.logits[draft.pending - 1 :] if self.reads_hidden else out.logits  # from the last committed token
        if draft.parents is None:
            path, next_token, rows = self._accept_chain(draft, logits)
        else:
            path, next_token, rows = self._accept_tree(draft, logits)
        fed = list(range(draft.pending)) + [draft.pending + i for i in path]  # forward rows now committed
        if draft.parents is None:
            self.target.truncate(self.seq, len(self.context) + len(path))
            kept, verified = len(fed), len(draft.tokens)
            self.stats.record_step(len(draft.tokens), len(path))
        else:
            kept, verified = self.target.commit_path(self.seq, fed), max(tree_depths(draft.parents), default=0)
            self.stats.record_tree_step(len(draft.tokens), verified, len(path))
        self.policy.observe_step(self.plan, verified, len(path), draft.pending + len(draft.tokens), forward_s,
                                 emitted=len(path) + (next_token is not None))
        if self.reads_hidden and out.hidden is not None:
            self.drafter.observe_hidden(self.draft_state, draft.cached, out.hidden[fed[:kept]])
        new = self._emit([draft.tokens[i] for i in path] + ([] if next_token is None else [next_token]), rows)
        now = time.perf_counter()
        self.stats.verify_time_s += now - draft.verify_started_at
        self.stats.wall_time_s = now - self.started_at
        self.stats.target_forward_time_s = self.target.forward_time_s - self.target_time_at_start
        return new

    # ---- the step's parts ---------------------------------------------------------------------------

    def budget(self) -> int:
        """Most draft tokens this step may verify (k, the tokens left, the context window)."""
        room = self.target.n_ctx - len(self.context) - 1  # prompt + output never exceed the window
        return max(0, min(self.cfg.num_speculative_tokens, self.cfg.max_new_tokens - len(self.out) - 1, room))

    def _draft_model_time(self) -> float:
        """Seconds the drafter's own model has spent in forward passes so far (0 without one)."""
        return getattr(self.drafter.model, "forward_time_s", 0.0) if self.drafter.model is not None else 0.0

    def _constrain(self, p: DraftProposal) -> Draft:
        """The proposal without what the constraint forbids, with the masks at the positions left.

        A chain is cut at its first forbidden token (kept in ``cut`` with its q row when the drafter
        sampled it, see :meth:`_accept_chain`) or after a token that completes the grammar. A tree loses
        the nodes whose path the constraint forbids (deterministic siblings only: for them a forbidden
        candidate changes nothing, since its masked p is already 0).

        Raises:
            ConfigError: a tree of sampled siblings under a constraint.
        """
        c = self.constraint
        if c is None:
            return Draft(p)
        if p.parents is None:
            n, masks, forbidden = c.chain_masks(p.tokens)
            if n == len(p.tokens):
                return Draft(p, masks)
            self.constraint_cut_tokens += len(p.tokens) - n
            cut = (int(p.tokens[n]), p.probs[n]) if forbidden and p.probs is not None else None
            return Draft(replace(p, tokens=list(p.tokens[:n]), probs=p.probs[:n] if p.probs is not None else None,
                                 confidence=list(p.confidence[:n]) if p.confidence is not None else None), masks, cut)
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
        return Draft(p, (root, node_masks))

    def _accept_chain(self, draft: Draft, logits: np.ndarray) -> tuple[list[int], int, np.ndarray]:
        """A chain's verification: (indices of the accepted draft tokens, the next token, the processed
        logits rows of the emitted tokens). Greedy: the longest prefix equal to the target's argmax;
        sampling: modified rejection sampling (Leviathan et al. 2023, algorithm 1)."""
        toks, proposal, sampler = draft.tokens, draft.proposal, self.sampler
        if sampler.uses_history:
            logits = sampler.adjust(logits, self.context, toks)
        if self.constraint is not None:
            logits = apply_masks(logits, draft.masks[: len(toks) + 1])
        if sampler.greedy:
            res = verify_greedy(sampler.argmax(logits), toks)
        else:
            q = proposal.probs[: len(toks)] if proposal.probs is not None else None
            verified = toks
            if draft.cut is not None and q is not None and len(toks) == len(proposal.tokens):
                # the forbidden token cut off after the draft was sampled from q: it is rejected
                # (masked p = 0), so its position draws from the residual norm(max(0, p - q)), not p
                verified = list(toks) + [draft.cut[0]]
                q = np.concatenate([q, draft.cut[1][None]])
            res = rejection_sample(lambda i: sampler.probs(logits[i]), verified, q, self.rng)
        return list(range(res.num_accepted)), res.next_token, logits

    def _accept_tree(self, draft: Draft, logits: np.ndarray) -> tuple[list[int], int | None, list[np.ndarray]]:
        """A token tree's verification (greedy: the longest path of argmax matches; sampling: recursive
        rejection sampling over siblings, SpecInfer, Miao et al. 2024): (the accepted path's node
        indices, the next token, the processed logits rows of the emitted tokens).

        Where only the spine's logits are bitwise plain decoding's (``target.tree_spine_only``: llama.cpp's
        exact numerics, where an off-spine node's K/V sits in a cell other than its position's), a path that
        ends at an off-spine node yields no next token: the next step's forward computes that position's
        logits as plain decoding does. The accepted tokens themselves were each drawn from a spine node's
        logits. (Drawing that token from the off-spine node's logits made a Qwen gate run differ from plain
        decoding: docs/bench/tree-off-spine-zen4.)"""
        toks, parents, nodes, sampler, prop = draft.tokens, draft.parents, draft.nodes, self.sampler, draft.proposal
        rows: dict[int, np.ndarray] = {}

        def row(u: int) -> np.ndarray:  # processed logits at node u (-1: the last committed token)
            if u not in rows:
                r = logits[u + 1]
                if sampler.uses_history:
                    hist = self.context + [toks[i] for i in path_to(parents, u)] if u >= 0 else self.context
                    r = sampler.adjust(r[None], hist, ())[0]
                if self.constraint is not None:
                    root_mask, node_masks = draft.masks
                    r = apply_masks(r[None], (root_mask if u < 0 else node_masks[nodes[u]])[None])[0]
                rows[u] = r
            return rows[u]

        if sampler.greedy:
            res = verify_tree_greedy(lambda u: int(np.argmax(row(u))), toks, parents)
        else:
            kids = tree_children(parents)
            child_probs = None
            if prop.probs is not None:
                def child_probs(u):
                    return prop.probs[nodes[kids[u][0]]] if kids[u] else None
            res = tree_rejection_sample(lambda u: sampler.probs(row(u)), toks, parents, child_probs, self.rng)
        path, next_token = list(res.path), res.next_token
        if path and self.target.tree_spine_only and path[-1] not in tree_spine(parents):
            next_token = None
        drawn_from = path if next_token is not None else path[:-1]  # rows the emitted tokens after the first came from
        return path, next_token, [row(-1)] + [row(i) for i in drawn_from]

    # ---- emission and the end -----------------------------------------------------------------------

    def _emit(self, tokens: Sequence[int], rows) -> list[int]:
        """Commit tokens one by one, stopping at EOS, a stop string, max_new_tokens or the end of
        the context window (prompt + output = n_ctx). ``rows[j]``: the processed logits token j was
        drawn from (for its logprob)."""
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
            if t in self.eos:
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
        """Free the sequence (its cache stays for prefix reuse) and the drafter state; tell the policy."""
        self.stats.wall_time_s = time.perf_counter() - self.started_at
        self.stats.target_forward_time_s = self.target.forward_time_s - self.target_time_at_start
        if not self.released:
            self.released = True
            self.policy.end_request(self.plan, self.stats.wall_time_s - self.stats.prefill_time_s,
                                    self.stats.draft_tokens > 0)
        if self.draft_state is not None:
            self.drafter.finish(self.draft_state, self.context)
            self.draft_state = None
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
