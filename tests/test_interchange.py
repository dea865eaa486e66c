"""Import of published draft-head layouts (EAGLE-1, EAGLE-3, speculators, Medusa-1) and export to them.

Nothing can be downloaded here, so the test builds a tiny randomly initialized
Hugging Face target (SmolLM2's tokenizer, 2 layers of width 64) and random heads
saved in each project's own layout, then checks that the imported drafter
computes what the layout means: the reference is transformers' own
LlamaDecoderLayer (input norm removed, as speculators does) fed [embeddings,
features], as EAGLE defines it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from speculative import SpeculativeGenerator
from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest
from speculative.drafters import build_drafter
from speculative.drafters.base import NoDrafter
from speculative.errors import ModelLoadError
from speculative.interchange import detect_layout, export_eagle, import_checkpoint

H, NH, NKV, HD, INTER = 64, 4, 2, 16, 128


def _tiny_llama(folder, smol, n_layers: int, seed: int):
    """A randomly initialized Llama of width 64 with SmolLM2's tokenizer, loaded by the transformers backend."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from speculative.backends.transformers import convert_gguf

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=H, intermediate_size=INTER, num_hidden_layers=n_layers, num_attention_heads=NH,
                      num_key_value_heads=NKV, head_dim=HD, vocab_size=smol.vocab_size, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    AutoTokenizer.from_pretrained(convert_gguf(str(smol.path))).save_pretrained(folder)
    return load_backend(str(folder), "transformers", n_ctx=512)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, smol):
    b = _tiny_llama(tmp_path_factory.mktemp("tiny-target"), smol, n_layers=2, seed=0)
    yield b
    b.close()


def _rand(*shape, scale=0.2):
    return torch.randn(*shape) * scale


def _eagle_tensors(prefix: str, fc: str):
    torch.manual_seed(1)
    t = {f"{fc}.weight": _rand(H, 2 * H), f"{fc}.bias": _rand(H)}
    for name, shape in {
        "self_attn.q_proj.weight": (NH * HD, H), "self_attn.k_proj.weight": (NKV * HD, H),
        "self_attn.v_proj.weight": (NKV * HD, H), "self_attn.o_proj.weight": (H, NH * HD),
        "mlp.gate_proj.weight": (INTER, H), "mlp.up_proj.weight": (INTER, H), "mlp.down_proj.weight": (H, INTER),
    }.items():
        t[prefix + name] = _rand(*shape)
    t[prefix + "post_attention_layernorm.weight"] = 1 + _rand(H, scale=0.05)
    return t


def _layer_cfg(vocab):
    return {"hidden_size": H, "intermediate_size": INTER, "num_attention_heads": NH, "num_key_value_heads": NKV,
            "head_dim": HD, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": vocab,
            "max_position_embeddings": 512, "hidden_act": "silu", "model_type": "llama"}


def write_speculators(folder, vocab):
    folder.mkdir(parents=True)
    save_file(_eagle_tensors("transformer.", "fusion_fc"), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "speculators_model_type": "eagle", "architectures": ["EagleSpeculator"], "layernorms": False,
        "fusion_bias": True, "transformer_layer_config": _layer_cfg(vocab),
        "speculators_config": {"algorithm": "eagle", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
                               "default_proposal_method": "greedy", "verifier": {"name_or_path": "tiny"}},
    }))
    return folder


def write_eagle1(folder, vocab):
    folder.mkdir(parents=True)
    save_file(_eagle_tensors("layers.0.", "fc"), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**_layer_cfg(vocab), "bias": True}))
    return folder


def reference_first_draft(tensors, prefix, fc, target, ids):
    """EAGLE's first draft token per its definition, with transformers' LlamaDecoderLayer."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(**{k: v for k, v in _layer_cfg(target.vocab_size).items() if k != "model_type"})
    layer = LlamaDecoderLayer(cfg, layer_idx=0)
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
    rope = LlamaRotaryEmbedding(cfg)
    target.truncate(0, 0)
    out = target.forward([ForwardRequest(0, ids, logits="all", hidden=True)])[0]
    target.truncate(0, 0)
    feats = torch.from_numpy(out.hidden[:-1])  # f_j for j = 0..n-2
    emb = target.model.get_input_embeddings().weight.detach()
    nxt = emb[torch.tensor(ids[1:])]  # x_{j+1}
    x = torch.cat([nxt, feats], dim=-1) @ tensors[f"{fc}.weight"].T + tensors[f"{fc}.bias"]
    pos = torch.arange(x.shape[0])[None]
    with torch.no_grad():
        y = layer(x[None], position_embeddings=rope(x[None], pos), position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        logits = y[0, -1] @ target.model.get_output_embeddings().weight.detach().T
    return int(torch.argmax(logits))


@pytest.mark.parametrize("layout", ["speculators", "eagle"])
def test_import_eagle_layouts(tiny_target, tmp_path, layout):
    src = (write_speculators if layout == "speculators" else write_eagle1)(tmp_path / "src", tiny_target.vocab_size)
    assert detect_layout(src) == ("speculators-eagle" if layout == "speculators" else "eagle")
    ours = import_checkpoint(src, tmp_path / "ours", target_vocab_size=tiny_target.vocab_size)
    d = build_drafter(f"eagle:{ours}", tiny_target)
    ids = tiny_target.encode("The quick brown fox jumps over the lazy dog and keeps running")
    prefix, fc = ("transformer.", "fusion_fc") if layout == "speculators" else ("layers.0.", "fc")
    from safetensors.torch import load_file

    want = reference_first_draft(load_file(str(src / "model.safetensors")), prefix, fc, tiny_target, ids)
    # the drafter's first proposal after the prompt ids[:-1] + [ids[-1]] (features of ids[:-1] known)
    st = d.start(ids[:-1])
    tiny_target.truncate(0, 0)
    out = tiny_target.forward([ForwardRequest(0, ids[:-1], logits="all", hidden=True)])[0]
    tiny_target.truncate(0, 0)
    d.observe_hidden(st, 0, out.hidden)
    gen = SpeculativeGenerator(tiny_target, d)
    got = d.propose(st, ids, 1, gen.make_sampler(gen.config), np.random.default_rng(0)).tokens
    assert got == [want]
    # lossless whatever the head: greedy output equals plain decoding
    plain = SpeculativeGenerator(tiny_target, NoDrafter()).generate(ids, max_new_tokens=12).token_ids
    spec = SpeculativeGenerator(tiny_target, d).generate(ids, max_new_tokens=12, num_speculative_tokens=3,
                                                         draft_policy="fixed").token_ids
    assert spec == plain


def test_import_medusa_layout(tiny_target, tmp_path):
    src = tmp_path / "medusa"
    src.mkdir()
    torch.manual_seed(2)
    V = tiny_target.vocab_size
    t = {}
    for i in range(2):
        t[f"{i}.0.linear.weight"] = _rand(H, H)
        t[f"{i}.0.linear.bias"] = _rand(H)
        t[f"{i}.1.weight"] = _rand(V, H)
    save_file(t, str(src / "medusa_lm_head.safetensors"))
    (src / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    assert detect_layout(src) == "medusa"
    ours = import_checkpoint(src, tmp_path / "ours")
    d = build_drafter(f"medusa:{ours}", tiny_target)
    ids = tiny_target.encode("One two three four five six")
    st = d.start(ids)
    tiny_target.truncate(0, 0)
    out = tiny_target.forward([ForwardRequest(0, ids[:-1], logits="all", hidden=True)])[0]
    tiny_target.truncate(0, 0)
    d.observe_hidden(st, 0, out.hidden)
    got = d.propose(st, ids, 2, SpeculativeGenerator(tiny_target).make_sampler(SpeculativeGenerator(tiny_target).config),
                    np.random.default_rng(0)).tokens
    f = torch.from_numpy(out.hidden[-1])
    want = []
    for i in range(2):  # Medusa-1: head i = LM_i(x + SiLU(W_i x + b_i))
        h = f + torch.nn.functional.silu(f @ t[f"{i}.0.linear.weight"].T + t[f"{i}.0.linear.bias"])
        want.append(int(torch.argmax(h @ t[f"{i}.1.weight"].T)))
    assert got == want
    plain = SpeculativeGenerator(tiny_target, NoDrafter()).generate(ids, max_new_tokens=10).token_ids
    assert SpeculativeGenerator(tiny_target, d).generate(ids, max_new_tokens=10, draft_policy="fixed").token_ids == plain


L3 = 8  # layers of the EAGLE-3 test target: the head reads hidden states 2, 4 and 5
VD = 300  # draft vocabulary of the EAGLE-3 test head


@pytest.fixture(scope="module")
def tiny_target8(tmp_path_factory, smol):
    b = _tiny_llama(tmp_path_factory.mktemp("tiny-target8"), smol, n_layers=L3, seed=3)
    yield b
    b.close()


def _eagle3_tensors(prefix: str, vocab: int, fc_bias: bool):
    g = torch.Generator().manual_seed(4)

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    t = {"fc.weight": r(H, 3 * H, scale=0.1), "norm.weight": 1 + r(H, scale=0.05), "lm_head.weight": r(VD, H, scale=0.5)}
    if fc_bias:
        t["fc.bias"] = r(H)
    for name, shape in {
        "self_attn.q_proj.weight": (NH * HD, 2 * H), "self_attn.k_proj.weight": (NKV * HD, 2 * H),
        "self_attn.v_proj.weight": (NKV * HD, 2 * H), "self_attn.o_proj.weight": (H, NH * HD),
        "mlp.gate_proj.weight": (INTER, H), "mlp.up_proj.weight": (INTER, H), "mlp.down_proj.weight": (H, INTER),
    }.items():
        t[prefix + name] = r(*shape)
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        t[f"{prefix}{norm}.weight"] = 1 + r(H, scale=0.05)
    # a reduced draft vocabulary: sorted target ids, stored as offsets (target id = draft id + d2t)
    ids = torch.sort(torch.randperm(vocab, generator=g)[:VD]).values
    t["d2t"] = ids - torch.arange(VD)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    t["t2d"] = t2d
    return t


def write_eagle3(folder, vocab, layout):
    folder.mkdir(parents=True)
    if layout == "eagle3":  # SafeAILab EAGLE-3: midlayer.*, no fc bias, LlamaConfig + draft_vocab_size
        save_file(_eagle3_tensors("midlayer.", vocab, fc_bias=False), str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({**_layer_cfg(vocab), "draft_vocab_size": VD}))
    else:  # speculators "eagle3": layers.0.*, fc bias, norm_before_residual
        save_file(_eagle3_tensors("layers.0.", vocab, fc_bias=True), str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({
            "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "draft_vocab_size": VD,
            "norm_before_residual": True, "transformer_layer_config": _layer_cfg(vocab),
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "tiny8"}},
        }))
    return folder


def reference_eagle3_drafts(t, prefix, target, ids, n, norm_before_residual):
    """EAGLE-3's first ``n`` greedy draft tokens after ``ids``, per its definition, with transformers'
    Llama modules: fuse hidden states 2, L//2, L-3; one layer over [norm(emb), norm(feature)]; its
    own LM head over the draft vocabulary; later steps feed the layer's output back as the feature."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb, repeat_kv)

    cfg = LlamaConfig(**{k: v for k, v in _layer_cfg(target.vocab_size).items() if k != "model_type"})

    def norm(name):
        m = LlamaRMSNorm(H, eps=1e-6)
        m.weight.data = t[name].clone()
        return m

    hidden_norm, input_norm = norm(prefix + "hidden_norm.weight"), norm(prefix + "input_layernorm.weight")
    post_norm, final_norm = norm(prefix + "post_attention_layernorm.weight"), norm("norm.weight")
    mlp = LlamaMLP(cfg)
    mlp.load_state_dict({k: t[prefix + "mlp." + k] for k in ("gate_proj.weight", "up_proj.weight", "down_proj.weight")})
    rope = LlamaRotaryEmbedding(cfg)
    emb_w = target.model.get_input_embeddings().weight.detach()
    with torch.no_grad():
        hs = target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        fused = torch.cat([hs[i][0] for i in (2, L3 // 2, L3 - 3)], dim=-1)[:-1]  # features of ids[:-1]
        feats = fused @ t["fc.weight"].T + (t["fc.bias"] if "fc.bias" in t else 0)
        toks = list(ids[1:])
        out = []
        for _ in range(n):
            hid = hidden_norm(feats)
            res = hid if norm_before_residual else feats
            x = torch.cat([input_norm(emb_w[torch.tensor(toks)]), hid], dim=-1)[None]
            m = x.shape[1]
            q = (x @ t[prefix + "self_attn.q_proj.weight"].T).view(1, m, NH, HD).transpose(1, 2)
            k = (x @ t[prefix + "self_attn.k_proj.weight"].T).view(1, m, NKV, HD).transpose(1, 2)
            v = (x @ t[prefix + "self_attn.v_proj.weight"].T).view(1, m, NKV, HD).transpose(1, 2)
            cos, sin = rope(v, torch.arange(m)[None])
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k, v = repeat_kv(k, NH // NKV), repeat_kv(v, NH // NKV)
            att = (q @ k.transpose(2, 3)) / HD**0.5 + torch.triu(torch.full((m, m), float("-inf")), 1)
            a = (att.softmax(-1) @ v).transpose(1, 2).reshape(1, m, NH * HD) @ t[prefix + "self_attn.o_proj.weight"].T
            h = res[None] + a
            y = (h + mlp(post_norm(h)))[0]
            d = int(torch.argmax(final_norm(y[-1]) @ t["lm_head.weight"].T))
            tok = d + int(t["d2t"][d])
            out.append(tok)
            feats = torch.cat([feats, y[-1:]])  # the layer's own output is the next feature
            toks.append(tok)
    return out


@pytest.mark.parametrize("layout", ["eagle3", "speculators"])
def test_import_eagle3(tiny_target8, smol, tmp_path, layout):
    from speculative.errors import ConfigError

    V = tiny_target8.vocab_size
    src = write_eagle3(tmp_path / "src", V, layout)
    assert detect_layout(src) == ("eagle3" if layout == "eagle3" else "speculators-eagle3")
    ours = import_checkpoint(src, tmp_path / "ours", target_vocab_size=V)
    d = build_drafter(f"eagle3:{ours}", tiny_target8)
    assert d.hidden_layers == (2, L3 // 2, L3 - 3)
    from safetensors.torch import load_file

    t = {k: (v.float() if v.is_floating_point() else v) for k, v in load_file(str(src / "model.safetensors")).items()}
    prefix = "midlayer." if layout == "eagle3" else "layers.0."
    ids = tiny_target8.encode("The quick brown fox jumps over the lazy dog and keeps running")
    want = reference_eagle3_drafts(t, prefix, tiny_target8, ids, 3, norm_before_residual=layout == "speculators")
    st = d.start(ids[:-1])
    tiny_target8.truncate(0, 0)
    out = tiny_target8.forward([ForwardRequest(0, ids[:-1], logits="all", hidden=True, hidden_layers=d.hidden_layers)])[0]
    tiny_target8.truncate(0, 0)
    assert out.hidden.shape == (len(ids) - 1, 3 * H)
    d.observe_hidden(st, 0, out.hidden)
    gen = SpeculativeGenerator(tiny_target8, d)
    got = d.propose(st, ids, 3, gen.make_sampler(gen.config), np.random.default_rng(0)).tokens
    assert got == want
    # lossless whatever the head: greedy output equals plain decoding, as a chain and as a tree
    plain = SpeculativeGenerator(tiny_target8, NoDrafter()).generate(ids, max_new_tokens=16).token_ids
    for spec in (f"eagle3:{ours}", f"eagle3:{ours},tree=2"):
        dd = build_drafter(spec, tiny_target8)
        r = SpeculativeGenerator(tiny_target8, dd).generate(ids, max_new_tokens=16, num_speculative_tokens=3,
                                                           draft_policy="fixed")
        assert r.token_ids == plain, spec
        assert r.stats.draft_tokens > 0
    # llama.cpp does not return intermediate layers: a clear error, not a crash mid-generation
    with pytest.raises(ConfigError, match="--backend transformers"):
        build_drafter(f"eagle3:{ours}", smol)


def test_eagle3_bad_checkpoint(tmp_path):
    src = tmp_path / "e3"
    src.mkdir()
    save_file({"midlayer.self_attn.q_proj.weight": _rand(8, 16), "d2t": torch.zeros(4, dtype=torch.long)},
              str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert detect_layout(src) == "eagle3"
    with pytest.raises(ModelLoadError, match="lacks fc.weight"):
        import_checkpoint(src, tmp_path / "x")


def test_export_speculators_round_trip(tiny_target, tmp_path):
    """Our head exported to speculators and imported back computes the same drafts."""
    from speculative.drafters.head_nets import EagleHead, HeadConfig, save_head

    torch.manual_seed(3)
    cfg = HeadConfig(method="eagle", hidden_size=H, vocab_ids=list(range(tiny_target.vocab_size)), n_heads=NH,
                     n_kv_heads=NKV, head_dim=HD, intermediate_size=INTER, window=4096,
                     target_vocab_size=tiny_target.vocab_size)
    head = EagleHead(cfg)
    for p in head.parameters():
        p.data.normal_(0, 0.2)
    save_head(head, cfg, tmp_path / "mine", int8=False)
    exp = export_eagle(tmp_path / "mine", tmp_path / "spec", "speculators", verifier="tiny")
    conf = json.loads((exp / "config.json").read_text())
    assert conf["speculators_model_type"] == "eagle" and conf["speculators_config"]["verifier"]["name_or_path"] == "tiny"
    back = import_checkpoint(exp, tmp_path / "back", target_vocab_size=tiny_target.vocab_size)
    ids = tiny_target.encode("A quick test of round trips between layouts")
    from safetensors.torch import load_file

    want = reference_first_draft(load_file(str(exp / "model.safetensors")), "transformer.", "fusion_fc", tiny_target, ids)
    for folder in (tmp_path / "mine", back):
        d = build_drafter(f"eagle:{folder}", tiny_target)
        st = d.start(ids[:-1])
        tiny_target.truncate(0, 0)
        out = tiny_target.forward([ForwardRequest(0, ids[:-1], logits="all", hidden=True)])[0]
        tiny_target.truncate(0, 0)
        d.observe_hidden(st, 0, out.hidden)
        sampler = SpeculativeGenerator(tiny_target).make_sampler(SpeculativeGenerator(tiny_target).config)
        assert d.propose(st, ids, 1, sampler, np.random.default_rng(0)).tokens == [want]
