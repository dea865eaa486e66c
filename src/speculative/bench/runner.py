"""``speculative bench``: every method on the same prompts, interleaved, resumable, gated on greedy identity.

Results are appended to ``runs.jsonl`` one line per (question, method), so an
interrupted run resumes where it stopped. Methods run in a rotated order per
question (A B C, B C A, ...), so machine drift and order effects hit all alike;
every run starts with empty KV caches.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config import GenerationConfig, SamplingParams
from ..errors import ConfigError, SpeculativeError
from ..backends.threads import pinned_threads
from ..stats import GenerationStats
from .datasets import Question, load_questions, select
from .methods import EngineMethod, Method, RunRecord

RUNS_FILE = "runs.jsonl"
CONFIG_FILE = "config.json"


@dataclass
class BenchConfig:
    """Everything that defines a bench run (its hash names the default output folder)."""

    target: str = "smollm2-135m-instruct"
    backend: str = "llama.cpp"
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    peers: list[str] = field(default_factory=list)
    endpoint: str | None = None
    dataset: str = "spec-bench"
    categories: list[str] | None = None
    per_category: int | None = 10
    max_new_tokens: int = 128
    k: int = 8
    sweep_k: list[int] | None = None
    draft_policy: str = "adaptive"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = 0
    n_ctx: int = 4096
    threads: int | None = None
    numerics: str = "exact"
    device: str | None = None
    dtype: str | None = None
    chat: bool | None = None
    peer_draft: str | None = None  # draft GGUF of the llama-server-spec peers (default: the first model: drafter)

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:10]

    def identity(self) -> dict:
        """The settings that define the run; fields added later are left out at their defaults,
        so that earlier runs keep their folder name and still resume."""
        d = asdict(self)
        for name, default in _LATE_FIELDS.items():
            if d.get(name) == default:
                d.pop(name, None)
        return d

    def generation_config(self) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            num_speculative_tokens=self.k,
            sampling=SamplingParams(self.temperature, self.top_k, self.top_p, self.seed),
            draft_policy=self.draft_policy,
        ).validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


#: BenchConfig fields added after runs were recorded, with the value that means "as before"
_LATE_FIELDS = {"peer_draft": None}


def default_output_dir(cfg: BenchConfig) -> Path:
    name = Path(cfg.target).stem if os.sep in cfg.target else cfg.target
    return Path("bench-results") / f"{name}-{cfg.backend}-{cfg.key()}"


class _RssSampler:
    """Samples the process's resident memory every 20 ms; peak per labelled interval."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self._peak = max(self._peak, self._proc.memory_info().rss)

    def start_interval(self) -> None:
        self._peak = self._proc.memory_info().rss

    def peak_mb(self) -> float:
        return max(self._peak, self._proc.memory_info().rss) / 2**20

    def close(self) -> None:
        self._stop.set()


class BenchRunner:
    """Loads the methods of a :class:`BenchConfig`, runs them, and writes results under ``output``."""

    def __init__(self, cfg: BenchConfig, output: Path | None = None, fresh: bool = False, progress: bool = True):
        self.cfg = cfg
        self.gen_cfg = cfg.generation_config()
        self.output = Path(output) if output else default_output_dir(cfg)
        self.progress = progress
        self.questions = select(load_questions(cfg.dataset), cfg.categories, cfg.per_category)
        if not self.questions:
            raise ConfigError("no questions selected")
        self.check_methods()  # before the output folder is made: a refused run leaves nothing behind
        self._prepare_output(fresh)
        self.methods: list[Method] = []
        self.load_rss_mb: dict[str, float] = {}
        self.target = None
        self.cost_model = None
        self._llama_server = None
        self._stock_site = None

    # ---- output folder and resume --------------------------------------------------

    def _prepare_output(self, fresh: bool) -> None:
        self.output.mkdir(parents=True, exist_ok=True)
        cfg_path = self.output / CONFIG_FILE
        runs = self.output / RUNS_FILE
        if fresh:
            for p in (runs, cfg_path):
                if p.exists():
                    p.unlink()
        if cfg_path.exists():
            old = json.loads(cfg_path.read_text())
            if {**_LATE_FIELDS, **old.get("config", {})} != asdict(self.cfg):
                raise ConfigError(
                    f"{self.output} holds a bench run with other settings; pass --fresh to restart it "
                    f"or --output for a new folder"
                )
        else:
            tmp = cfg_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"config": asdict(self.cfg), "created": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
            os.replace(tmp, cfg_path)

    def completed(self) -> dict[tuple[int, str], dict]:
        """Records already in ``runs.jsonl`` (a torn last line, from a kill mid-write, is ignored)."""
        done = {}
        path = self.output / RUNS_FILE
        if not path.exists():
            return done
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            done[(r["question_id"], r["method"])] = r
        return done

    def _append(self, record: dict) -> None:
        path = self.output / RUNS_FILE
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    # ---- methods ---------------------------------------------------------------------

    def load_methods(self) -> None:
        import psutil

        from ..backends import load_backend
        from ..cost_model import cached_verify_cost
        from ..drafters import BuildContext, build_drafter, parse_drafter_spec, tree_leaves
        from ..drafters.base import NoDrafter
        from ..engine import SpeculativeGenerator

        proc = psutil.Process()
        c = self.cfg
        ks = c.sweep_k or [c.k]
        for spec in c.drafters:
            parsed = parse_drafter_spec(spec)  # fail fast, before loading anything
            if len(ks) > 1 and parsed.kind == "suffix" and parsed.options.get("cache"):
                raise ConfigError(f"--sweep-k runs each k as a tenant of its own, and the suffix cache file of "
                                  f"'{spec}' would keep each k's answers for its next run: drop cache= or --sweep-k")
        rss0 = proc.memory_info().rss
        width = max([tree_leaves(s) for s in c.drafters] + [0])
        target = load_backend(c.target, c.backend, n_ctx=c.n_ctx, n_threads=pinned_threads(c.threads), numerics=c.numerics,
                              device=c.device, dtype=c.dtype, tree_width=width)
        self.target = target
        self.load_rss_mb["baseline"] = (proc.memory_info().rss - rss0) / 2**20
        chat = (target.chat_template is not None) if c.chat is None else c.chat
        if chat and target.chat_template is None:
            raise ConfigError(f"{c.target} has no chat template; drop --chat")
        self.chat = chat
        self.cost_model = cached_verify_cost(target)
        base = SpeculativeGenerator(target, NoDrafter(), self.gen_cfg, cost_model=self.cost_model)
        self.methods.append(EngineMethod("baseline", base, "baseline", None, "fixed", chat))
        ctx = BuildContext(backend=c.backend, n_threads=pinned_threads(c.threads), numerics=c.numerics, device=c.device,
                           dtype=c.dtype, n_ctx=c.n_ctx)
        for spec in c.drafters:
            if spec.strip().lower() == "none":
                continue
            rss0 = proc.memory_info().rss
            drafter = build_drafter(spec, target, ctx)
            extra = (proc.memory_info().rss - rss0) / 2**20
            gen = SpeculativeGenerator(target, drafter, self.gen_cfg, cost_model=self.cost_model)
            for k in ks:
                label = spec if len(ks) == 1 else f"{spec} k={k}"
                # one drafter serves every k of a sweep: each k runs as a tenant of its own (its own suffix
                # memory, acceptance calibration and draft policy), so that no k reads another's answers
                tenant = "" if len(ks) == 1 else f"bench k={k}"
                self.methods.append(EngineMethod(label, gen, "ours", k, c.draft_policy, chat, tenant))
                self.load_rss_mb[label] = extra
        self._load_peers(chat)
        labels = [m.label for m in self.methods]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"two methods share a label: {labels}")

    def check_methods(self) -> None:
        """What can be checked of the drafters and peers before anything loads: none named twice, and the
        variables that point a peer at another build name one.

        Raises:
            ConfigError: a drafter or peer given twice.
            BackendUnavailableError: ``$SPECULATIVE_LLAMA_SERVER`` or ``$SPECULATIVE_STOCK_LLAMA_SITE`` is set
                for a peer that reads it and names no such build.
        """
        c = self.cfg
        for what, names in (("--drafter", [s.strip() for s in c.drafters]), ("--peer", list(c.peers))):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ConfigError(f"{what} {twice[0]} is given twice")
        if any(n.startswith("llama-server") for n in c.peers):
            from .llama_server import binary_from_environment

            binary_from_environment()
        if any(n.startswith("llama-cpp-python-stock") for n in c.peers):
            from .stock_peer import site_from_environment

            site_from_environment()

    def _load_peers(self, chat: bool) -> None:
        import psutil

        from .peers import EndpointPeer, LlamaCppPythonPeer, TransformersPeer

        proc = psutil.Process()
        c = self.cfg
        target = self.target
        hf = None
        for name in c.peers:
            rss0 = proc.memory_info().rss
            if name in ("llama-cpp-python", "llama-cpp-python-lookup"):
                from ..models import resolve

                src = resolve(c.target)
                if src.kind != "gguf":
                    raise ConfigError(f"peer {name} needs a GGUF target")
                m = LlamaCppPythonPeer(src.location, target, chat, name.endswith("lookup"), c.n_ctx, target_threads(target, c))
            elif name in ("llama-cpp-python-stock", "llama-cpp-python-stock-lookup"):
                m = self._stock_llama_cpp_python_peer(name, chat)
            elif name.startswith("llama-server"):
                m = self._llama_server_peer(name, chat)
            elif name.startswith("transformers"):
                if hf is None:
                    hf = target if c.backend == "transformers" else _load_hf(c)
                if name == "transformers":
                    m = TransformersPeer(hf, target, chat, "plain")
                elif name == "transformers-lookup":
                    m = TransformersPeer(hf, target, chat, "lookup")
                elif name.startswith("transformers-assisted:"):
                    from ..backends import load_backend

                    spec = name.split(":", 1)[1]
                    asst = load_backend(spec, "transformers", device=c.device, dtype=c.dtype, n_ctx=c.n_ctx)
                    m = TransformersPeer(hf, target, chat, spec, assistant=asst.model)
                else:
                    raise ConfigError(f"unknown peer '{name}': choose from {', '.join(_peer_names())}")
            else:
                raise ConfigError(f"unknown peer '{name}': choose from {', '.join(_peer_names())}")
            self.methods.append(m)
            self.load_rss_mb[m.label] = getattr(m, "load_rss_mb", None) or (proc.memory_info().rss - rss0) / 2**20
        if c.endpoint:
            self.methods.append(EndpointPeer(c.endpoint, target, chat))

    def _stock_llama_cpp_python_peer(self, name: str, chat: bool):
        """llama-cpp-python as pip builds it by default, in a subprocess (built on first use; :mod:`.stock_peer`)."""
        from ..models import resolve
        from .stock_peer import ENV_SITE, StockLlamaCppPythonPeer, stock_llama_cpp_python_site

        c = self.cfg
        src = resolve(c.target)
        if src.kind != "gguf":
            raise ConfigError(f"peer {name} needs a GGUF target")
        if self._stock_site is None:
            self._stock_site = stock_llama_cpp_python_site(progress=self.progress)
        return StockLlamaCppPythonPeer(self._stock_site, src.location, self.target, chat, name.endswith("lookup"),
                                       c.n_ctx, target_threads(self.target, c), self.output,
                                       unmodified=not os.environ.get(ENV_SITE))

    def _llama_server_peer(self, name: str, chat: bool):
        """A llama-server variant on the same GGUF files (built on first use; see :mod:`.llama_server`)."""
        from ..models import resolve
        from .llama_server import DRAFT_VARIANTS, VARIANTS, LlamaServerPeer, llama_server_binary

        c = self.cfg
        if name not in VARIANTS:
            raise ConfigError(f"unknown peer '{name}': choose from {', '.join(_peer_names())}")
        src = resolve(c.target)
        if src.kind != "gguf":
            raise ConfigError(f"peer {name} needs a GGUF target")
        draft = None
        if name in DRAFT_VARIANTS:
            spec = c.peer_draft or peer_draft_default(c.drafters)
            if spec is None:
                raise ConfigError(f"peer {name} needs a draft model: --peer-draft MODEL, or a --drafter model:NAME")
            dsrc = resolve(spec)
            if dsrc.kind != "gguf":
                raise ConfigError(f"peer {name} needs a GGUF draft model, got {spec}")
            draft = dsrc.location
        if self._llama_server is None:
            self._llama_server = llama_server_binary(progress=self.progress)
        return LlamaServerPeer(name, self._llama_server, src.location, self.target, chat, c.n_ctx,
                               target_threads(self.target, c), self.output, draft=draft)

    # ---- the run -------------------------------------------------------------------------

    def run(self) -> dict:
        """Run what is missing, then aggregate and write the reports. Returns the results dict."""
        from tqdm import tqdm

        from .report import compare, write_reports

        done = self.completed()
        todo = [(q, m) for q in self.questions for m in self._order(q)]
        remaining = [(q, m) for q, m in todo if (q.question_id, m.label) not in done]
        sampler = _RssSampler()
        bar = tqdm(total=len(todo), initial=len(todo) - len(remaining), desc="bench", unit="run",
                   disable=not self.progress, file=sys.stderr, dynamic_ncols=True)
        interrupted = False
        try:
            for q, m in remaining:
                bar.set_postfix_str(f"q{q.question_id} {m.label}", refresh=False)
                sampler.start_interval()
                rec = m.run(q, self.gen_cfg)
                row = self._record(q, m, rec, sampler.peak_mb())
                self._append(row)
                done[(q.question_id, m.label)] = row
                if self.cfg.greedy:
                    base = done.get((q.question_id, "baseline"))
                    if base is not None and m.kind == "ours" and not compare(base, row):
                        bar.write(f"MISMATCH: {m.label} differs from plain greedy decoding on question {q.question_id}")
                bar.update(1)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            bar.close()
            sampler.close()
        if interrupted:
            # a report of what was measured so far; the runs stay, and the same command resumes
            if any(lab == "baseline" for _, lab in done):
                write_reports(self, done)
                print(f"interrupted: partial report in {self.output}; rerun the same command to resume",
                      file=sys.stderr)
            raise KeyboardInterrupt
        results = write_reports(self, done)
        return results

    def _order(self, q: Question) -> list[Method]:
        i = self.questions.index(q) % len(self.methods)
        return self.methods[i:] + self.methods[:i]

    def _record(self, q: Question, m: Method, rec: RunRecord, rss_mb: float) -> dict:
        return {
            "question_id": q.question_id,
            "category": q.category,
            "method": m.label,
            "kind": m.kind,
            "k": m.k,
            "compare_by": m.compare_by,
            "turn_token_ids": rec.turn_token_ids,
            "texts": rec.texts,
            "new_tokens": rec.new_tokens,
            "wall_time_s": rec.wall_time_s,
            "prefill_time_s": rec.prefill_time_s,
            "stats": rec.stats.to_dict() if rec.stats is not None else None,
            # a server peer reports its own process's peak
            "rss_peak_mb": rec.extra.get("rss_peak_mb", rss_mb),
            **({"extra": rec.extra} if rec.extra else {}),
        }

    def close(self) -> None:
        for m in self.methods:
            try:
                m.close()
            except SpeculativeError:  # pragma: no cover
                pass
        if self.target is not None:
            self.target.close()


def target_threads(target, cfg: BenchConfig) -> int:
    from ..backends.llama_cpp import default_threads

    return cfg.threads or getattr(target, "n_threads", None) or default_threads()


def peer_draft_default(drafters: list[str]) -> str | None:
    """The model of the first ``model:NAME`` drafter (the llama-server-spec peers' draft model), or None."""
    from ..drafters import parse_drafter_spec

    for spec in drafters:
        d = parse_drafter_spec(spec)
        if d.kind == "model" and d.name:
            return d.name
    return None


def _load_hf(c: BenchConfig):
    from ..backends import load_backend

    return load_backend(c.target, "transformers", device=c.device, dtype=c.dtype, n_ctx=c.n_ctx, n_threads=pinned_threads(c.threads))


def _peer_names() -> list[str]:
    from .peers import PEER_NAMES

    return list(PEER_NAMES)


def stats_of(row: dict) -> GenerationStats | None:
    return GenerationStats.from_dict(row["stats"]) if row.get("stats") else None
