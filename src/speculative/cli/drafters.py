"""``speculative drafters | make-drafter | train-drafter | export-drafter | import-drafter``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import SpeculativeError


def cmd_drafters(args) -> int:
    from ..drafters import DRAFTER_TYPES

    for kind, t in sorted(DRAFTER_TYPES.items()):
        name = {True: f"{kind}:NAME_OR_PATH", False: kind, None: f"{kind}[:NAME_OR_PATH]"}[t.needs_name]
        print(f"{name}\n  {t.help}")
        for key, help_ in t.options.items():
            print(f"    {key}=...  {help_}")
    shipped = _shipped_drafter_lines()
    if shipped:
        print("\nshipped drafters (trained by this project):")
        print("\n".join(shipped))
    from ..drafters import default_drafter
    from ..models import REGISTRY

    print("\nauto (the default of --drafter): the target's recommended drafter; the adaptive policy decides "
          "per request whether it pays")
    for name in sorted(REGISTRY):
        print(f"  {name}: {default_drafter(name)}")
    return 0


def _shipped_drafter_lines() -> list[str]:
    from importlib import resources

    from ..drafters import shipped_drafters

    root = Path(str(resources.files("speculative") / "data" / "drafters"))
    lines = []
    for name in shipped_drafters():
        meta = json.loads((root / name / "drafter.json").read_text())
        kind = {"draft-model": "model", "eagle": "eagle", "medusa": "medusa"}.get(meta.get("method"), meta.get("method"))
        size = meta.get("non_embedding_parameters")
        info = f"{size / 1e6:.1f}M non-embedding parameters" if size else f"{len(meta.get('vocab_ids', [])):,}-token draft vocabulary"
        est = ""
        tj = root / name / "training.json"
        if tj.is_file():
            h = json.loads(tj.read_text()).get("heldout") or {}
            if h.get("mean_accepted_tokens"):
                est = f"; development prompts: τ {h['mean_accepted_tokens']:.2f} at k = {h.get('k', 4)}"
        lines.append(f"  --drafter {kind}:{name}  (for {meta.get('target')}; {info}{est})")
    return lines


def cmd_make_drafter(args) -> int:
    from ..derive import derive_drafter

    out = derive_drafter(
        args.target, args.output, quant=args.quant, drop_layers=args.drop_layers,
        n_threads=args.threads, overwrite=args.force,
    )
    print(f"wrote {out}; use it with --drafter model:{out}")
    return 0


def cmd_train_drafter(args) -> int:
    from ..training.data import DataConfig
    from ..training.train import TrainConfig, train_draft_model_pipeline, train_drafter

    for name in ("prompts", "max_new_tokens", "epochs", "draft_vocab", "layers", "batch_size", "eval_prompts",
                 "parallel", "train_tokens"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise SpeculativeError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.text_tokens < 0:
        raise SpeculativeError(f"--text-tokens must be >= 0, got {args.text_tokens}")
    if args.text_tokens and args.data_backend == "transformers":
        raise SpeculativeError("--text-tokens: the standard-library text is prefilled with --data-backend llama.cpp only")
    if args.method != "eagle" and args.inference_precision != "auto":
        raise SpeculativeError(f"--inference-precision {args.inference_precision}: {args.method} drafters run "
                               f"{'fp32' if args.method == 'medusa' else 'as GGUF models in llama.cpp'}; "
                               "the option is for EAGLE heads")
    from ..training.recommend import check_inference_vocab

    try:
        check_inference_vocab(args.inference_vocab, args.method, args.draft_vocab, name="--inference-vocab")
    except ValueError as e:
        raise SpeculativeError(str(e)) from None
    if args.method != "eagle" and args.unroll_context != "own":
        raise SpeculativeError(f"--unroll-context {args.unroll_context}: only EAGLE heads unroll their drafting steps")
    if args.lr is not None and not 0 < args.lr < 1:
        raise SpeculativeError(f"--lr must be between 0 and 1, got {args.lr}")
    from ..models import resolve

    resolve(args.target, verify=False)  # an unknown target fails here, before any folder is touched
    if args.device:
        import torch

        try:
            dev = torch.device(args.device)
        except RuntimeError:
            raise SpeculativeError(f"--device {args.device}: not a torch device (cpu, cuda, cuda:N, mps)") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SpeculativeError(f"--device {args.device}: PyTorch sees no CUDA device")
    for extra in args.extra_data or []:
        if not any((Path(extra) / "data").glob("*.npz")):
            raise SpeculativeError(f"--extra-data {extra}: no training data there (expected {extra}/data/*.npz)")
    if args.data_from and not (Path(args.data_from) / "data").is_dir():
        raise SpeculativeError(f"--data-from {args.data_from}: not a training run folder (no {args.data_from}/data)")
    out = Path(args.output)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "train_config.json").is_file())):
        raise SpeculativeError(f"{out} exists and is not a training run folder (no train_config.json): "
                               "choose a new --output")
    if args.epochs is None:
        args.epochs = 2 if args.method == "draft-model" else 6
    if args.batch_size is None:
        args.batch_size = 8 if args.method == "draft-model" else 16
    cfg = TrainConfig(
        method="eagle" if args.method == "eagle" else ("medusa" if args.method == "medusa" else "draft-model"),
        epochs=args.epochs, batch_size=args.batch_size, draft_vocab=args.draft_vocab, threads=args.threads,
        **({"lr": args.lr} if args.lr is not None else {}), eval_prompts=args.eval_prompts,
        data_from=args.data_from, extra_data=list(args.extra_data or []), seed=args.seed, target=args.target,
        device=args.device, data_backend=args.data_backend, precision=args.precision, train_tokens=args.train_tokens,
        inference_precision=args.inference_precision, inference_vocab=args.inference_vocab,
        unroll_context=args.unroll_context,
        data=DataConfig(prompts_a=args.prompts, prompts_b=args.prompts // 2, max_new_tokens=args.max_new_tokens,
                        seed=args.seed, prompt_set=args.prompt_set, parallel=args.parallel,
                        text_tokens=args.text_tokens),
    )
    saved = out / "train_config.json"
    if saved.exists() and not args.fresh:
        import dataclasses

        try:
            old = json.loads(saved.read_text())
            if not isinstance(old, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            raise SpeculativeError(f"{saved}: damaged training configuration ({e}); pass --fresh to start over") from None
        old.setdefault("target", args.target)  # run folders from before the target was recorded
        new = dataclasses.asdict(cfg)
        if args.method == "draft-model":
            new.update(n_layers=args.layers, intermediate=args.intermediate)
        new = json.loads(json.dumps(new))
        old.setdefault("data_backend", "llama.cpp")  # run folders from before it was recorded
        old.setdefault("precision", "auto")
        old.setdefault("train_tokens", None)
        old.setdefault("unroll_context", "own")
        old.get("data", {}).setdefault("text_tokens", 0)
        for cfg_dict in (old, new):  # where it runs, how many prompts at once and the recommended inference
            cfg_dict.pop("device", None)  # precision and vocabulary (decided after training) do not change the run
            cfg_dict.pop("inference_precision", None)
            cfg_dict.pop("inference_vocab", None)
            cfg_dict.get("data", {}).pop("parallel", None)
        if old != new:
            raise SpeculativeError(f"{out} holds a training run with other settings; pass --fresh or another --output")
        print(f"[speculative] resuming the training run in {out}", file=sys.stderr)
    elif args.fresh and out.exists():
        import shutil

        shutil.rmtree(out)
    if args.method == "draft-model":
        m = train_draft_model_pipeline(args.target, out, cfg, n_layers=args.layers, intermediate=args.intermediate)
    else:
        m = train_drafter(args.target, out, cfg)
    h = m["heldout"]
    print(f"trained {args.method} drafter in {out}: held-out (development prompts, greedy, k=4) "
          f"mean accepted tokens per step {h['mean_accepted_tokens']:.2f}, acceptance rate {h['acceptance_rate']:.1%}")
    for what, key in (("inference precision", "inference_precision"), ("draft vocabulary", "inference_vocab")):
        rec = m.get(key)
        if rec:
            tried = ", ".join(f"{k}: τ {e['mean_accepted_tokens']:.2f}, {e['draft_ms_per_token']:.2f} ms per draft "
                              "token" for k, e in rec["heldout"].items())
            whole = f" of the head's {rec['whole']} tokens" if "whole" in rec else ""
            print(f"{what} {rec['choice']}{whole} ({rec['how']}; {tried})")
    spec = {"eagle": "eagle", "medusa": "medusa", "draft-model": "model"}[args.method]
    target_file = out / ("draft.gguf" if args.method == "draft-model" else "drafter")
    print(f"use it with: --drafter {spec}:{target_file}")
    return 0


def cmd_export_drafter(args) -> int:
    from ..drafters import trained_drafter_dir
    from ..interchange import export_eagle, export_medusa
    from ..drafters.head_nets import HeadConfig

    if args.k < 1:
        raise SpeculativeError(f"--k must be >= 1, got {args.k}")
    folder = trained_drafter_dir(args.drafter)
    try:
        meta = json.loads((folder / "drafter.json").read_text())
        if not isinstance(meta, dict):
            raise ValueError("a JSON object was expected")
    except ValueError as e:
        raise SpeculativeError(f"{folder / 'drafter.json'}: not a drafter description ({e})") from None
    method = meta.get("method")
    want = "medusa" if args.format == "medusa" else "eagle"
    if method != want:
        raise SpeculativeError(f"{args.drafter} is a drafter of kind '{method}'; only {want} drafters export to the "
                               f"{args.format} layout")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise SpeculativeError(f"--output {args.output} is a file")
    try:
        cfg = HeadConfig.from_dict(meta)
    except (ValueError, TypeError) as e:
        raise SpeculativeError(f"{folder / 'drafter.json'}: not a drafter description ({e})") from None
    if args.format in ("speculators", "eagle"):
        out = export_eagle(folder, args.output, args.format, verifier=args.verifier or "", speculative_tokens=args.k)
    else:
        from ..backends import load_backend
        from ..drafters.heads import target_embedding_matrices

        b = load_backend(args.target or cfg.target, n_ctx=256, check_numerics=False)
        try:
            _, head = target_embedding_matrices(b)
            out = export_medusa(folder, args.output, head, verifier=args.verifier or "")
        finally:
            b.close()
    print(f"wrote {out} ({args.format} layout)")
    return 0


def cmd_import_drafter(args) -> int:
    from ..interchange import detect_layout, import_checkpoint

    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise SpeculativeError(f"--output {args.output} is a file")
    layout = detect_layout(args.source)  # fails fast on a wrong folder, before loading the target
    vocab = 0
    if args.target:
        from ..backends import load_backend

        b = load_backend(args.target, args.backend, n_ctx=256, check_numerics=False)
        vocab = b.vocab_size
        b.close()
    out = import_checkpoint(args.source, args.output, target_name=args.target or "", target_vocab_size=vocab,
                            layout=layout)
    kind = "medusa" if layout == "medusa" else ("eagle3" if layout.endswith("eagle3") else "eagle")
    hint = " --backend transformers" if kind == "eagle3" else ""
    print(f"imported {layout} checkpoint into {out}; use it with{hint} --drafter {kind}:{out}")
    return 0
