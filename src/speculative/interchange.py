"""Export our draft heads to other tools' layouts, and import published heads.

Layouts (field and tensor names as those projects define them):

* ``speculators`` (vLLM's speculators library, ``speculators_model_type: "eagle"``):
  ``config.json`` with ``transformer_layer_config`` (a LlamaConfig) and
  ``speculators_config`` (proposal methods, verifier); weights ``fusion_fc.*`` and
  ``transformer.*`` (a LlamaDecoderLayer without input norm). vLLM serves it with
  ``--speculative-config '{"model": DIR, "num_speculative_tokens": k}'``.
* ``eagle`` (EAGLE-1, SafeAILab): ``config.json`` (LlamaConfig + ``bias``) and
  weights ``fc.*`` and ``layers.0.*``.
* ``medusa`` (Medusa-1, FasterDecoding): ``config.json`` with ``medusa_num_heads``,
  ``medusa_num_layers``; weights ``{i}.{j}.linear.*`` (residual blocks) and
  ``{i}.{L}.weight`` (each head's LM head).

* ``eagle3`` (EAGLE-3, SafeAILab): ``config.json`` (LlamaConfig + ``draft_vocab_size``,
  optional ``target_hidden_size``) and weights ``fc.weight`` [H, 3 Ht],
  ``midlayer.*`` (q/k/v read 2H: [normed embedding, normed feature];
  ``hidden_norm``, ``input_layernorm``), ``norm.weight``, ``lm_head.weight``
  [Vd, H], ``d2t`` (draft id d is target id d + d2t[d]) and ``t2d``.
* ``speculators`` with ``speculators_model_type: "eagle3"``: the same with
  ``layers.0.*``, an ``fc`` bias, ``norm_before_residual`` and optional
  ``eagle_aux_hidden_state_layer_ids``.

EAGLE's fusion layer reads [embeddings, features]; ours reads [features,
embeddings]: the two halves of the fusion weight are swapped on the way.
EAGLE-3 heads read the hidden states of three target layers (by default
2, L // 2 and L - 3 of L, Hugging Face's ``hidden_states`` indices), which the
transformers backend returns; llama.cpp does not expose them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import ConfigError, ModelLoadError

_LAYER_NAMES = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight",
)
_OURS = {
    "self_attn.q_proj.weight": "q_proj.weight", "self_attn.k_proj.weight": "k_proj.weight",
    "self_attn.v_proj.weight": "v_proj.weight", "self_attn.o_proj.weight": "o_proj.weight",
    "mlp.gate_proj.weight": "gate.weight", "mlp.up_proj.weight": "up.weight", "mlp.down_proj.weight": "down.weight",
    "post_attention_layernorm.weight": "post_norm.weight",
}


def _swap_halves(w, h: int):
    import torch

    return torch.cat([w[:, h:], w[:, :h]], dim=1)


def _llama_layer_config(cfg, vocab_size: int) -> dict:
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "vocab_size": vocab_size, "max_position_embeddings": 4096,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "num_hidden_layers": 1,
        "tie_word_embeddings": False,
    }


def export_eagle(drafter_dir: str | Path, out_dir: str | Path, layout: str = "speculators", verifier: str = "",
                 speculative_tokens: int = 5) -> Path:
    """Write an EAGLE-style head of ours in the ``speculators`` or ``eagle`` (EAGLE-1) layout.

    Raises:
        ConfigError: not an eagle head, or an unknown layout.
    """
    from safetensors.torch import save_file

    from .drafters.head_nets import load_head

    names = {"speculators": ("fusion_fc", "transformer."), "eagle": ("fc", "layers.0.")}
    if layout not in names:
        raise ConfigError(f"unknown layout '{layout}': choose speculators or eagle")
    head, cfg = load_head(Path(drafter_dir))
    if cfg.method != "eagle":
        raise ConfigError(f"{drafter_dir} holds a drafter of kind '{cfg.method}'; only eagle heads export to {layout}")
    sd = {k: v.detach().float().contiguous() for k, v in head.state_dict().items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = cfg.target_vocab_size
    fc_w = _swap_halves(sd["fc.weight"], cfg.hidden_size).contiguous()
    note = ("trained by speculative with a sliding attention window of "
            f"{cfg.window} positions on the target's final (post-norm) hidden states")
    fc, prefix = names[layout]
    tensors = {f"{fc}.weight": fc_w}
    if "fc.bias" in sd:
        tensors[f"{fc}.bias"] = sd["fc.bias"]
    for theirs, ours in _OURS.items():
        tensors[prefix + theirs] = sd[ours]
    if layout == "speculators":
        config = {
            "speculators_model_type": "eagle",
            "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
            "transformer_layer_architecture": "LlamaDecoderLayer",
            "transformer_layer_config": _llama_layer_config(cfg, vocab),
            "layernorms": False,
            "fusion_bias": "fc.bias" in sd,
            "speculators_config": {
                "algorithm": "eagle",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens)}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": verifier or cfg.target, "architectures": []},
            },
            "speculative_note": note,
        }
    else:
        config = {**_llama_layer_config(cfg, vocab), "bias": "fc.bias" in sd, "speculative_note": note,
                  "base_model_name_or_path": verifier or cfg.target}
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def export_medusa(drafter_dir: str | Path, out_dir: str | Path, target_head_rows: np.ndarray, verifier: str = "") -> Path:
    """Write our Medusa heads in the Medusa-1 layout; each head's LM head is the target's ([V, H]) as trained."""
    import torch
    from safetensors.torch import save_file

    from .drafters.head_nets import load_head

    head, cfg = load_head(Path(drafter_dir))
    if cfg.method != "medusa":
        raise ConfigError(f"{drafter_dir} holds a drafter of kind '{cfg.method}', not medusa")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lm = torch.from_numpy(np.asarray(target_head_rows, dtype=np.float32))
    tensors = {}
    for i, block in enumerate(head.blocks):
        tensors[f"{i}.0.linear.weight"] = block.weight.detach().float().contiguous()
        tensors[f"{i}.0.linear.bias"] = block.bias.detach().float().contiguous()
        tensors[f"{i}.1.weight"] = lm.clone()
    save_file(tensors, str(out / "medusa_lm_head.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "medusa_num_heads": cfg.medusa_heads, "medusa_num_layers": 1,
        "base_model_name_or_path": verifier or cfg.target, "hidden_size": cfg.hidden_size,
        "vocab_size": int(lm.shape[0]),
    }, indent=1))
    return out


def _load_tensors(folder: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    tensors = {}
    for p in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(p)))
    for name in ("pytorch_model.bin", "medusa_lm_head.pt"):
        if (folder / name).is_file():
            tensors.update(torch.load(folder / name, map_location="cpu", weights_only=True))
    return tensors


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no config.json: not a draft-head checkpoint")
    try:
        cfg = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return cfg


def _load_state(head, state: dict, src: Path) -> None:
    """``head.load_state_dict(state)`` with a one-line error naming the first mismatch."""
    try:
        head.load_state_dict(state)
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise ModelLoadError(f"{src}: weights do not match its config.json: {lines[1] if len(lines) > 1 else lines[0]}") from e


def detect_layout(folder: str | Path) -> str:
    """"speculators", "eagle", "eagle3" or "medusa" (from config.json and tensor names).

    Raises:
        ModelLoadError: not a recognized draft-head checkpoint.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder} does not exist or is not a folder")
    cfg = _read_config(folder)
    if not any(folder.glob("*.safetensors")) and not any((folder / n).is_file() for n in ("pytorch_model.bin", "medusa_lm_head.pt")):
        raise ModelLoadError(f"{folder}: no weights found (*.safetensors, pytorch_model.bin, medusa_lm_head.pt)")
    if "speculators_model_type" in cfg:
        return "speculators-" + str(cfg["speculators_model_type"])
    if "medusa_num_heads" in cfg:
        return "medusa"
    names = set(_load_tensors(folder))
    if any(n.startswith("midlayer.") for n in names) or "d2t" in names:
        return "eagle3"
    if "fc.weight" in names and any(n.startswith("layers.0.") for n in names):
        return "eagle"
    raise ModelLoadError(f"{folder}: unrecognized checkpoint layout (tensors {sorted(names)[:6]}...)")


def import_checkpoint(src: str | Path, out_dir: str | Path, target_name: str = "", target_vocab_size: int = 0,
                      window: int = 4096, layout: str | None = None) -> Path:
    """Convert a published EAGLE / speculators / Medusa checkpoint into a drafter folder of ours.

    The imported head drafts over the target's full vocabulary (its own LM head
    for EAGLE; the checkpoint's per-head LM heads for Medusa) and attends over
    ``window`` past positions (EAGLE heads are trained with full causal attention).
    ``layout``: what :func:`detect_layout` returned for ``src``, if already known.

    Raises:
        ModelLoadError: unrecognized or unsupported layout, or missing tensors.
    """
    src = Path(src)
    layout = layout or detect_layout(src)
    cfg_json = _read_config(src)
    tensors = {k: v.float() for k, v in _load_tensors(src).items()}
    try:
        return _import(src, Path(out_dir), layout, cfg_json, tensors, target_name, target_vocab_size, window)
    except KeyError as e:  # a config key or tensor the layout requires
        raise ModelLoadError(f"{src}: {layout} checkpoint lacks {e} (in config.json or the weights)") from e


def _import(src: Path, out: Path, layout: str, cfg_json: dict, tensors: dict, target_name: str,
            target_vocab_size: int, window: int) -> Path:
    import torch

    from .drafters.head_nets import HeadConfig, MedusaHeads, build_head, save_head

    if layout in ("eagle3", "speculators-eagle3"):
        return _import_eagle3(src, out, layout, cfg_json, tensors, target_name, target_vocab_size, window)
    if layout.startswith("speculators-") and layout != "speculators-eagle":
        raise ModelLoadError(f"{src}: speculators model type {layout.split('-', 1)[1]!r} is not supported")
    if layout in ("eagle", "speculators-eagle"):
        lc = cfg_json.get("transformer_layer_config", cfg_json)
        prefix = "transformer." if layout == "speculators-eagle" else "layers.0."
        fc = "fusion_fc" if layout == "speculators-eagle" else "fc"
        h = int(lc["hidden_size"])
        n_heads = int(lc["num_attention_heads"])
        hcfg = HeadConfig(
            method="eagle", hidden_size=h, vocab_ids=list(range(int(lc.get("vocab_size", target_vocab_size)))),
            n_heads=n_heads, n_kv_heads=int(lc.get("num_key_value_heads", n_heads)),
            head_dim=int(lc.get("head_dim") or h // n_heads), intermediate_size=int(lc["intermediate_size"]),
            window=window, rope_theta=float(lc.get("rope_theta", (lc.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            norm_eps=float(lc.get("rms_norm_eps", 1e-6)), fc_bias=f"{fc}.bias" in tensors,
            target=target_name or str(cfg_json.get("base_model_name_or_path", "")),
            target_vocab_size=target_vocab_size or int(lc.get("vocab_size", 0)),
            extra={"imported_from": str(src), "layout": layout},
        )
        head = build_head(hcfg)
        state = {"fc.weight": _swap_halves(tensors[f"{fc}.weight"], h)}
        if hcfg.fc_bias:
            state["fc.bias"] = tensors[f"{fc}.bias"]
        for theirs, ours in _OURS.items():
            state[ours] = tensors[prefix + theirs]
        _load_state(head, state, src)
        save_head(head, hcfg, out, int8=False)
        return out
    # Medusa-1
    k = int(cfg_json["medusa_num_heads"])
    n_layers = int(cfg_json.get("medusa_num_layers", 1))
    if n_layers != 1:
        raise ModelLoadError(f"{src}: Medusa heads with {n_layers} residual blocks; one block per head imports")
    w0 = tensors["0.0.linear.weight"]
    h = int(w0.shape[0])
    vocab = int(tensors[f"0.{n_layers}.weight"].shape[0])
    hcfg = HeadConfig(method="medusa", hidden_size=h, vocab_ids=list(range(vocab)), medusa_heads=k,
                      target=target_name or str(cfg_json.get("base_model_name_or_path", "")),
                      target_vocab_size=target_vocab_size or vocab,
                      extra={"imported_from": str(src), "layout": layout, "own_lm_heads": True})
    head = build_head(hcfg)
    assert isinstance(head, MedusaHeads)
    state = {}
    for i in range(k):
        state[f"blocks.{i}.weight"] = tensors[f"{i}.0.linear.weight"]
        state[f"blocks.{i}.bias"] = tensors[f"{i}.0.linear.bias"]
    _load_state(head, state, src)
    save_head(head, hcfg, out, int8=False)
    lm = torch.stack([tensors[f"{i}.{n_layers}.weight"] for i in range(k)])
    from safetensors.torch import save_file

    save_file({"lm_heads": lm.contiguous()}, str(out / "lm_heads.safetensors"))
    return out


_EAGLE3_NAMES = {
    "self_attn.q_proj.weight": "q_proj.weight", "self_attn.k_proj.weight": "k_proj.weight",
    "self_attn.v_proj.weight": "v_proj.weight", "self_attn.o_proj.weight": "o_proj.weight",
    "mlp.gate_proj.weight": "gate.weight", "mlp.up_proj.weight": "up.weight", "mlp.down_proj.weight": "down.weight",
    "post_attention_layernorm.weight": "post_norm.weight", "hidden_norm.weight": "hidden_norm.weight",
    "input_layernorm.weight": "input_norm.weight",
}


def _import_eagle3(src: Path, out: Path, layout: str, cfg_json: dict, tensors: dict, target_name: str,
                   target_vocab_size: int, window: int) -> Path:
    """EAGLE-3 (SafeAILab ``midlayer.*`` or speculators ``layers.0.*``) into an ``eagle3`` drafter folder."""
    import torch

    from .drafters.head_nets import HeadConfig, build_head, save_head

    lc = cfg_json.get("transformer_layer_config", cfg_json)
    prefix = "layers.0." if layout == "speculators-eagle3" else "midlayer."
    missing = [n for n in ["fc.weight", "norm.weight", "lm_head.weight", "d2t"] + [prefix + k for k in _EAGLE3_NAMES]
               if n not in tensors]
    if missing:
        raise ModelLoadError(f"{src}: EAGLE-3 checkpoint lacks {', '.join(missing[:4])}")
    h = int(lc["hidden_size"])
    n_heads = int(lc["num_attention_heads"])
    d2t = tensors["d2t"].round().long()
    vd = int(tensors["lm_head.weight"].shape[0])
    if d2t.numel() != vd:
        raise ModelLoadError(f"{src}: d2t has {d2t.numel()} entries but lm_head drafts over {vd} tokens")
    vocab_ids = (torch.arange(vd, dtype=torch.long) + d2t).tolist()
    target_vocab = target_vocab_size or int(lc.get("vocab_size", 0))
    if target_vocab and max(vocab_ids) >= target_vocab:
        raise ModelLoadError(f"{src}: d2t maps draft tokens to ids up to {max(vocab_ids)}, beyond the "
                             f"target's {target_vocab:,}-token vocabulary")
    fc_w = tensors["fc.weight"]
    aux = cfg_json.get("eagle_aux_hidden_state_layer_ids") or lc.get("eagle_aux_hidden_state_layer_ids") or []
    hcfg = HeadConfig(
        method="eagle3", hidden_size=h, vocab_ids=[int(t) for t in vocab_ids], n_heads=n_heads,
        n_kv_heads=int(lc.get("num_key_value_heads", n_heads)), head_dim=int(lc.get("head_dim") or h // n_heads),
        intermediate_size=int(lc["intermediate_size"]), window=window,
        rope_theta=float(lc.get("rope_theta", (lc.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        norm_eps=float(lc.get("rms_norm_eps", 1e-6)), fc_bias="fc.bias" in tensors,
        aux_layers=[int(i) for i in aux], target_hidden_size=int(fc_w.shape[1]) // 3,
        norm_before_residual=bool(cfg_json.get("norm_before_residual", False)),
        target=target_name or str(cfg_json.get("base_model_name_or_path", "")
                                  or (cfg_json.get("speculators_config") or {}).get("verifier", {}).get("name_or_path", "")),
        target_vocab_size=target_vocab, extra={"imported_from": str(src), "layout": layout},
    )
    head = build_head(hcfg)
    state = {"fc.weight": fc_w, "norm.weight": tensors["norm.weight"], "lm_head.weight": tensors["lm_head.weight"]}
    if hcfg.fc_bias:
        state["fc.bias"] = tensors["fc.bias"]
    for theirs, ours in _EAGLE3_NAMES.items():
        state[ours] = tensors[prefix + theirs]
    _load_state(head, state, src)
    save_head(head, hcfg, out, int8=False)
    return out

