"""The generator: a target, a drafter, its draft policy and the target's cost model, and the loop
that drives one request.

:class:`~speculative.request.DecodeRequest` holds one generation's state and its step (propose →
verify → accept → commit → emit; the algorithm, Leviathan et al. 2023, is described there);
:mod:`speculative.policy` decides when to draft and what of a draft to verify;
:mod:`speculative.output` holds what a generation emits. :class:`SpeculativeGenerator` drives one
request at a time; :mod:`speculative.server.scheduler` drives many.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from .backends.base import Backend
from .config import GenerationConfig
from .cost_model import CostModel, cached_verify_cost
from .drafters.base import Drafter, NoDrafter
from .errors import ConfigError
from .output import Generation, GenerationResult, OutputText, TextStream, TokenLogprob
from .policy import DraftPolicy
from .request import DecodeRequest
from .sampling import Sampler

__all__ = ["DecodeRequest", "Generation", "GenerationResult", "OutputText", "Prompt", "SpeculativeGenerator",
           "TextStream", "TokenLogprob"]

Prompt = str | Sequence[int] | Sequence[dict]


class SpeculativeGenerator:
    """Lossless speculative decoding of ``target`` with ``drafter``.

    Args:
        target: the target model's backend.
        drafter: a :class:`~speculative.drafters.base.Drafter`; None means plain decoding.
        config: default :class:`~speculative.config.GenerationConfig`; per-call overrides allowed.
        cost_model: the target's verification cost; measured (once per machine, cached) when needed.

    Attributes:
        policy: the drafter's :class:`~speculative.policy.DraftPolicy`, kept across this generator's requests
            of tenant "" (every other tenant has one of its own: :meth:`policy_for`).

    Example::

        from speculative import SpeculativeGenerator
        gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram")
        print(gen.generate("What is speculative decoding?", max_new_tokens=64).text)
    """

    def __init__(
        self,
        target: Backend,
        drafter: Drafter | None = None,
        config: GenerationConfig | None = None,
        cost_model: CostModel | None = None,
    ):
        self.target = target
        self.drafter = drafter or NoDrafter()
        if self.drafter.target is not target:
            self.drafter.bind(target)
        self.drafter.warm_up()  # once per drafter: one built by build_drafter is warm already
        self.config = (config or GenerationConfig()).validate()
        self._cost_model = cost_model
        self.policy = DraftPolicy(self.drafter)
        self._tenant_policies: OrderedDict[str, DraftPolicy] = OrderedDict()

    #: most tenants whose draft policy is kept (the least recently used goes first)
    MAX_TENANT_POLICIES = 10_000

    def policy_for(self, tenant: str) -> DraftPolicy:
        """The draft policy of a tenant's requests: :attr:`policy` for tenant "" (the CLI and library),
        else one policy per tenant (the least recently used of :attr:`MAX_TENANT_POLICIES` goes first), so
        that whether and how much a drafter drafts for one tenant never depends on what it measured on
        another tenant's requests (their acceptance rests on their text). What the drafter costs on this
        machine (:class:`~speculative.policy.DrafterTimings`) is shared; whether it pays is not, so each new
        tenant's first requests measure it afresh."""
        if not tenant or isinstance(self.drafter, NoDrafter):
            return self.policy
        pol = self._tenant_policies.pop(tenant, None) or DraftPolicy(self.drafter, timings=self.policy.timings)
        self._tenant_policies[tenant] = pol
        while len(self._tenant_policies) > self.MAX_TENANT_POLICIES:
            self._tenant_policies.popitem(last=False)
        return pol

    @property
    def cost_model(self) -> CostModel:
        """The target's verification cost T(n): cached per machine and model, measured once (~1 s) if missing."""
        if self._cost_model is None:
            self._cost_model = cached_verify_cost(self.target)
        return self._cost_model

    @classmethod
    def from_pretrained(
        cls,
        target: str = "smollm2-135m-instruct",
        drafter: str | None = "auto",
        backend: str = "llama.cpp",
        *,
        n_ctx: int | None = 4096,
        n_threads: int | None = None,
        numerics: str = "exact",
        device: str | None = None,
        dtype: str | None = None,
        max_sequences: int = 1,
        config: GenerationConfig | None = None,
    ) -> SpeculativeGenerator:
        """Load target and drafter from specs (registered names, paths, HF ids; see ``--drafter``).

        ``drafter=None`` (or "none") decodes plainly; "auto" (the default) is the target's
        recommended drafter (:func:`speculative.drafters.default_drafter`; n-gram drafting for every
        bundled target today, since no trained drafter pays on them yet). Raises ConfigError / ModelNotFoundError
        for a bad spec or a missing model.
        """
        from .backends import load_backend
        from .drafters import BuildContext, build_drafter, resolve_drafter, tree_leaves

        drafter = resolve_drafter(target, drafter)

        t = load_backend(
            target, backend, n_ctx=n_ctx, n_threads=n_threads, max_sequences=max_sequences,
            numerics=numerics, device=device, dtype=dtype, tree_width=tree_leaves(drafter),
        )
        try:
            ctx = BuildContext(
                backend=backend, n_threads=n_threads, numerics=numerics, device=device, dtype=dtype,
                n_ctx=n_ctx, max_sequences=max_sequences,
            )
            d = build_drafter(drafter, t, ctx)
        except BaseException:
            t.close()
            raise
        return cls(t, d, config)

    # ---- prompts ----------------------------------------------------------------

    def encode_prompt(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids of a prompt: text (chat template applied when ``chat``), messages, or ids.

        ``chat=None`` applies the template when the model has one.

        Raises:
            ConfigError: empty prompt, text that is not valid Unicode (a lone surrogate), or chat
                asked for without a template.
        """
        try:
            return self._encode_prompt(prompt, chat)
        except UnicodeEncodeError as e:  # a lone surrogate (from JSON escapes, or argv bytes that are not UTF-8)
            raise ConfigError(f"the prompt is not valid Unicode text (lone surrogate "
                              f"\\u{ord(e.object[e.start]):04x})") from None

    def _encode_prompt(self, prompt: Prompt, chat: bool | None) -> list[int]:
        t = self.target
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ConfigError("the prompt is empty")
            use_chat = (t.chat_template is not None) if chat is None else chat
            if use_chat:
                return t.apply_chat_template([{"role": "user", "content": prompt}])
            return t.encode(prompt)
        items = list(prompt)
        if not items:
            raise ConfigError("the prompt is empty")
        if isinstance(items[0], dict):
            return t.apply_chat_template(items)
        ids = [int(x) for x in items]
        if any(i < 0 or i >= t.vocab_size for i in ids):
            raise ConfigError(f"prompt token ids must be in [0, {t.vocab_size})")
        return ids

    # ---- generation ---------------------------------------------------------------

    def generate(self, prompt: Prompt, *, chat: bool | None = None, **overrides) -> GenerationResult:
        """Generate to the end; ``overrides`` are :class:`GenerationConfig` or :class:`SamplingParams`
        fields (``max_new_tokens``, ``num_speculative_tokens``, ``temperature``, ``top_k``, ``top_p``,
        ``seed``, ``stop``, ``logprobs``, penalties, ...).
        """
        g = self.stream(prompt, chat=chat, **overrides)
        for _ in g.blocks():
            pass
        assert g.result is not None
        return g.result

    def stream(self, prompt: Prompt, *, chat: bool | None = None, **overrides) -> Generation:
        """Like :meth:`generate`, as an iterator of text pieces; ``.result`` is set at the end.

        Validation errors are raised here, before the first piece.
        """
        req = self.new_request(prompt, chat=chat, **overrides)
        return Generation(self._steps(req), req)

    def new_request(self, prompt: Prompt, *, chat: bool | None = None, **overrides) -> DecodeRequest:
        """A validated :class:`DecodeRequest` (not started)."""
        cfg = self.config.with_(**overrides).validate() if overrides else self.config
        ids = self.encode_prompt(prompt, chat)
        self.target.check_prompt_fits(len(ids))
        if cfg.sampling.logit_bias and max(cfg.sampling.logit_bias) >= self.target.vocab_size:
            raise ConfigError(f"logit_bias token ids must be < {self.target.vocab_size}")
        return self.open_request(ids, cfg, messages=self._chat_messages(prompt, chat))

    def open_request(self, prompt_ids: Sequence[int], cfg: GenerationConfig,
                     messages: Sequence[dict] | None = None) -> DecodeRequest:
        """A :class:`DecodeRequest` for prompt token ids under a validated ``cfg`` (not started); the
        target's cost model is measured first when the request needs it (the adaptive policy).

        Raises:
            ContextOverflowError: the prompt leaves no room for a new token.
        """
        return DecodeRequest.open(self.target, self.drafter, self.policy_for(cfg.tenant), lambda: self.cost_model,
                                  prompt_ids, cfg,
                                  self.make_sampler(cfg, len(prompt_ids)), messages)

    def _chat_messages(self, prompt: Prompt, chat: bool | None) -> list[dict] | None:
        """The messages a prompt is rendered from by the chat template (None for raw text or ids)."""
        if isinstance(prompt, str):
            use_chat = (self.target.chat_template is not None) if chat is None else chat
            return [{"role": "user", "content": prompt}] if use_chat else None
        items = list(prompt)
        return items if items and isinstance(items[0], dict) else None

    def make_sampler(self, cfg: GenerationConfig, prompt_len: int = 0) -> Sampler:
        suppress = self.target.eos_token_ids if cfg.stop_at_eos else ()
        return Sampler(cfg.sampling, prompt_len, min_tokens=cfg.min_tokens, suppress=suppress)

    def _steps(self, req: DecodeRequest) -> Iterator[list[int]]:
        try:
            yield req.prefill()
            while not req.done:
                new = req.step(self.target.forward)
                if new:
                    yield new
        finally:
            req.release()

    def reset_caches(self) -> None:
        """Empty every KV cache of target and drafter (no prefix reuse into the next generation)."""
        for s in range(self.target.max_sequences):
            self.target.truncate(s, 0)
        self.drafter.reset_caches()

    def close(self) -> None:
        """Free drafter and target."""
        self.drafter.close()
        self.target.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
