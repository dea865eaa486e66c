"""Training smoke tests (a few steps on a tiny slice: the loss goes down), resume, and the GGUF export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from speculative.backends.llama_cpp import LlamaCppBackend
from speculative.backends.base import ForwardRequest
from speculative.models import resolve
from speculative.training.data import DataConfig, load_shards
from speculative.training.prompts import stage_a_prompts, stage_b_prompts
from speculative.training.train import TrainConfig, train_drafter

TARGET = "smollm2-135m-instruct"
TINY = DataConfig(prompts_a=6, prompts_b=2, max_new_tokens=40, window=16)


def test_training_prompts_are_our_own():
    from speculative.bench.datasets import load_questions

    bench = {t for q in load_questions("spec-bench") for t in q.turns} | {t for q in load_questions("dev") for t in q.turns}
    for prompt_set in (1, 2):
        a = stage_a_prompts(300, seed=0, prompt_set=prompt_set)
        assert len(a) == 300 and len(set(a)) == 300 and a == stage_a_prompts(300, seed=0, prompt_set=prompt_set)
        assert not (set(a) & bench)
    assert stage_a_prompts(300, seed=1) != stage_a_prompts(300, seed=0)
    b = stage_b_prompts(["word " * 50, "short"], seed=0)
    assert len(b) == 1 and "word word" in b[0]


def test_self_instruct_prompt_set_is_kept_and_reused(tmp_path):
    """Prompt set 3: half the stage-A prompts are requests the target writes; they are saved once."""
    from speculative.bench.datasets import load_questions
    from speculative.training.data import generate_data
    from speculative.training.prompts import self_instruct_pool

    cfg = DataConfig(prompts_a=6, prompts_b=0, max_new_tokens=4, window=8, prompt_set=3, parallel=4, seed=3)
    d = generate_data(TARGET, tmp_path, cfg, progress=False)
    prompts = json.loads((d / "prompts-a.json").read_text())
    written = set(stage_a_prompts(3, seed=3, prompt_set=2))
    generated = [p for p in prompts if p not in written]
    assert len(prompts) == 6 and len(set(prompts)) == 6 and len(generated) == 3
    held_out = {t for name in ("spec-bench", "dev") for q in load_questions(name) for t in q.turns}
    assert all("\n" not in p and p not in held_out and p not in self_instruct_pool(3) for p in generated)
    before = load_shards(d)
    assert len(before) == 6
    (d / "a-0000.npz").unlink()  # resume: the saved prompts are reused, not sampled again
    generate_data(TARGET, tmp_path, cfg, progress=False)
    assert json.loads((d / "prompts-a.json").read_text()) == prompts
    assert all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(before, load_shards(d), strict=True))


@pytest.mark.parametrize("method,context", [("eagle", "own"), ("medusa", "own"), ("eagle", "target")])
def test_head_training_loss_goes_down_and_resumes(tmp_path_factory, method, context):
    out = tmp_path_factory.mktemp(method)
    cfg = TrainConfig(method=method, epochs=3, batch_size=2, lr=3e-3, draft_vocab=2048, data=TINY, eval_prompts=2,
                      unroll_context=context)
    m = train_drafter(TARGET, out, cfg, progress=False)
    losses = [h["train_loss"] for h in m["history"]]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    assert (out / "drafter" / "drafter.json").is_file() and (out / "checkpoint.pt").is_file()
    h = m["heldout"]
    assert 1.0 <= h["mean_accepted_tokens"] <= 5.0
    # per category: the development set's first two prompts; categories' counts add up to the total's, and
    # the total counts each prompt once (at most 64 new tokens each: a prompt counted twice would exceed it)
    from speculative.bench.datasets import load_questions

    cats = [q.category for q in load_questions("dev")[:2]]
    by = h["by_category"]
    assert {c: v["prompts"] for c, v in by.items()} == {c: cats.count(c) for c in cats}
    assert 0 < h["new_tokens"] <= 2 * 64
    assert sum(v["new_tokens"] for v in by.values()) == h["new_tokens"]
    assert sum(v["steps"] for v in by.values()) == h["steps"]
    assert all(1.0 <= v["mean_accepted_tokens"] <= 5.0 for v in by.values())
    # the recommended inference precision: an EAGLE head measured in fp32 and int8, the faster recorded in its
    # drafter.json (and the held-out figures are the chosen precision's); Medusa heads run fp32
    ip, iv = m["inference_precision"], m["inference_vocab"]
    extra = json.loads((out / "drafter" / "drafter.json").read_text())["extra"]
    assert extra["inference_precision"] == ip["choice"]
    if method == "eagle":
        assert set(ip["heldout"]) == {"fp32", "int8"} and ip["how"].startswith("measured")
        rates = {p: ip[f"{p}_tokens_per_s"] for p in ("fp32", "int8")}
        assert ip["choice"] == max(rates, key=rates.get) and all(r > 0 for r in rates.values())
        # the draft vocabulary: the whole trained one (evaluated again: the same drafts as the chosen precision's
        # evaluation) and half of --draft-vocab (a quarter is under 1024), the fastest that loses no accepted draft
        # recorded; the held-out figures are those of the recommendation
        whole = iv["whole"]
        assert whole >= 2048 and set(iv["heldout"]) == {str(whole), "1024"} and iv["how"].startswith("measured")
        assert iv["heldout"][str(whole)]["mean_accepted_tokens"] == ip["heldout"][ip["choice"]]["mean_accepted_tokens"]
        assert iv["choice"] in (whole, 1024) and extra["draft_vocab"] == iv["choice"]
        tau = {int(n): e["mean_accepted_tokens"] for n, e in iv["heldout"].items()}
        assert tau[iv["choice"]] >= tau[whole] and h["mean_accepted_tokens"] == tau[iv["choice"]]
        if tau[1024] >= tau[whole]:
            assert iv["choice"] == max((whole, 1024), key=lambda n: iv[f"{n}_tokens_per_s"])
    else:
        assert set(ip["heldout"]) == {"fp32"} and ip["choice"] == "fp32"
        assert iv is None and "draft_vocab" not in extra
        assert h["mean_accepted_tokens"] == ip["heldout"]["fp32"]["mean_accepted_tokens"]
    # a run killed during its final evaluation leaves the earlier complete drafter/ as it was (the new head
    # waits in drafter.pending/ and is published only with its recommendation); resuming evaluates again
    if method == "eagle" and context == "own":
        import speculative.training.recommend as recommend_mod
        import speculative.training.train as train_mod

        published = {f.name: f.read_bytes() for f in (out / "drafter").iterdir()}

        def killed(*a, **kw):
            raise KeyboardInterrupt

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(recommend_mod, "evaluate_drafter", killed)
            with pytest.raises(KeyboardInterrupt):
                train_drafter(TARGET, out, TrainConfig(**{**cfg.__dict__, "epochs": 4}), progress=False)
        assert {f.name: f.read_bytes() for f in (out / "drafter").iterdir()} == published
        assert (out / "drafter.pending" / "drafter.json").is_file()
    # resume: more epochs continue from the checkpoint; the data is not generated again
    shards = sorted(p.stat().st_mtime for p in (out / "data").glob("*.npz"))
    m2 = train_drafter(TARGET, out, TrainConfig(**{**cfg.__dict__, "epochs": 4}), progress=False)
    assert not (out / "drafter.pending").exists() and not (out / "drafter.old").exists()
    assert "inference_precision" in json.loads((out / "drafter" / "drafter.json").read_text())["extra"]
    if method == "eagle" and context == "own":
        assert {f.name: f.read_bytes() for f in (out / "drafter").iterdir()} != published  # the new head published
        # a kill between _publish's two renames: drafter.old/ complete, no drafter/; the next run puts it back
        (out / "drafter").rename(out / "drafter.old")
        train_mod._restore_published(out / "drafter")
        assert (out / "drafter" / "drafter.json").is_file() and not (out / "drafter.old").exists()
    assert [h["epoch"] for h in m2["history"]] == [1, 2, 3, 4]
    assert m2["history"][:3] == m["history"]
    assert sorted(p.stat().st_mtime for p in (out / "data").glob("*.npz")) == shards
    # damaged files of a run folder: one error naming the file, nothing else touched
    from speculative.errors import SpeculativeError

    ckpt, config = out / "checkpoint.pt", out / "train_config.json"
    good, settings = ckpt.read_bytes(), config.read_text()
    ckpt.write_bytes(good[: len(good) // 2])
    cfg4 = TrainConfig(**{**cfg.__dict__, "epochs": 4})  # the settings the folder holds now
    with pytest.raises(SpeculativeError, match=f"{ckpt}: damaged or not this run's checkpoint"):
        train_drafter(TARGET, out, cfg4, progress=False)
    ckpt.write_bytes(good)
    shard = sorted((out / "data").glob("a-*.npz"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(SpeculativeError, match=f"{shard}: damaged training data shard"):
        train_drafter(TARGET, out, cfg4, progress=False)
    assert ckpt.read_bytes() == good and config.read_text() == settings


def test_data_generation_resumes_after_a_lost_shard(tmp_path):
    from speculative.training.data import generate_data

    cfg = DataConfig(prompts_a=60, prompts_b=0, max_new_tokens=4, window=8)
    d = generate_data(TARGET, tmp_path, cfg, progress=False)
    shards = sorted(d.glob("*.npz"))
    assert len(shards) == 2
    before = load_shards(d)
    shards[1].unlink()
    generate_data(TARGET, tmp_path, cfg, progress=False)
    after = load_shards(d)
    assert len(after) == len(before) == 60
    assert all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(before, after))
    # two runs that share prompts train on each prompt once
    from speculative.training.data import load_training_examples

    assert len(load_training_examples([d, d])) == 60
    # a shard's arrays are read once and shared by its examples (memory stays the data's size)
    assert before[0]["feats"].base is not None and before[0]["feats"].base is before[1]["feats"].base


def test_batched_data_generation_equals_one_prompt_at_a_time(tmp_path):
    """Decoding prompts in lockstep (one sequence each) gives the same data, bit for bit."""
    import dataclasses

    from speculative.training.data import generate_data

    cfg = DataConfig(prompts_a=7, prompts_b=0, max_new_tokens=48, window=8, parallel=1)
    one = load_shards(generate_data(TARGET, tmp_path / "one", cfg, progress=False))
    many = load_shards(generate_data(TARGET, tmp_path / "many", dataclasses.replace(cfg, parallel=4), progress=False))
    assert len(one) == len(many) == 7
    lengths = {len(e["tokens"]) - e["prompt_len"] for e in one}
    assert len(lengths) > 1, "the prompts should finish at different steps"
    for a, b in zip(one, many):
        assert a["prompt_len"] == b["prompt_len"] and a["feat_start"] == b["feat_start"]
        for key in ("tokens", "feats", "topk_vals", "lse"):
            assert np.array_equal(a[key], b[key]), key
        assert np.array_equal(np.sort(a["topk_ids"], axis=1), np.sort(b["topk_ids"], axis=1))


def test_draft_model_distillation_loss_goes_down(tmp_path):
    from speculative.training.data import generate_data
    from speculative.training.draft_model import train_draft_model

    generate_data(TARGET, tmp_path, TINY, progress=False)
    ex = load_shards(tmp_path / "data")
    res = train_draft_model(TARGET, tmp_path / "dm", 1, ex, epochs=3, batch_size=2, lr=1e-3, intermediate=256,
                            progress=False)
    losses = [h["train_loss"] for h in res["history"]]
    assert losses[-1] < losses[0], losses
    assert res["non_embedding_parameters"] < 0.02 * 106e6


def test_gguf_export_matches_the_pytorch_draft(tmp_path):
    """The draft model written to GGUF runs in llama.cpp with the PyTorch model's logits (within tolerance)."""
    from speculative.gguf_io import assemble_gguf, load_layers
    from speculative.training.draft_model import build_draft, save_layers

    draft, picks = build_draft(TARGET, 2)
    assert picks == [0, 29]
    target_gguf = resolve(TARGET).location
    save_layers(draft, tmp_path / "d", TARGET, target_gguf)
    meta = json.loads((tmp_path / "d" / "drafter.json").read_text())
    assert meta["num_hidden_layers"] == 2 and (tmp_path / "d" / "layers.safetensors").stat().st_size < 8e6
    gguf_path = assemble_gguf(tmp_path / "d", target_gguf)
    sd = draft.state_dict()
    for k, v in load_layers(tmp_path / "d").items():  # the shipped (int8) weights
        sd[k] = torch.from_numpy(v)
    draft.load_state_dict(sd)
    b = LlamaCppBackend(gguf_path, n_ctx=256)
    try:
        ids = b.encode("Speculative decoding drafts tokens and verifies them with the target model.")
        lc = b.forward([ForwardRequest(0, ids, logits="all")])[0].logits.copy()
    finally:
        b.close()
    with torch.no_grad():
        hf = draft(torch.tensor([ids])).logits[0].numpy()
    cos = (hf * lc).sum(-1) / np.linalg.norm(hf, axis=-1) / np.linalg.norm(lc, axis=-1)
    assert cos.min() > 0.9999, cos.min()
    assert (hf.argmax(-1) == lc.argmax(-1)).mean() >= 0.9
    assert np.abs(hf - lc).max() < 1.0


def test_draft_vocabulary_ranks_outputs_then_candidates_then_prompts_then_low_ids():
    from speculative.training.data import draft_vocabulary

    ex = {"tokens": np.array([50, 51, 51, 9, 9, 9, 7], dtype=np.int32), "prompt_len": 3,
          "topk_ids": np.array([[9, 40], [9, 41], [7, 40], [7, 40]], dtype=np.int32)}
    # outputs: 9 (x3), 7; candidates: 40 (x3), 41; prompts: 51 (x2), 50; then lowest ids 0, 1, ...
    assert draft_vocabulary([ex], 64, 8) == [9, 7, 40, 41, 51, 50, 0, 1]
    assert draft_vocabulary([ex], 64, 2, always=[63, 9]) == [9, 7, 63]


def test_text_data_rows_are_the_targets_own_at_every_position(tmp_path):
    """Standard-library pieces: feature row j and top-k row j are what one forward of the piece gives at
    position j (the layout of an answer: prompt_len 1, feat_start 0), and a piece is trained on once."""
    from speculative.training.data import TEXT_CHUNK, generate_data, load_training_examples

    cfg = DataConfig(prompts_a=1, prompts_b=0, max_new_tokens=2, window=4, text_tokens=2 * TEXT_CHUNK + 5, topk=8)
    d = generate_data(TARGET, tmp_path, cfg, progress=False)
    text = [e for e in load_shards(d) if e["text"]]
    assert len(text) == 2 and all(len(e["tokens"]) == TEXT_CHUNK for e in text)
    assert text[0]["tokens"].tolist() != text[1]["tokens"].tolist()
    assert len(load_training_examples([d, d])) == 3  # one answer + two distinct pieces, each once
    be = LlamaCppBackend(resolve(TARGET).location, n_ctx=512)
    try:
        e = text[1]
        out = be.forward([ForwardRequest(0, e["tokens"].tolist(), logits="all", hidden=True)])[0]
        hidden, logits = np.array(out.hidden[:-1]), np.array(out.logits[:-1], np.float32)  # copies: views die with be
    finally:
        be.close()
    assert e["prompt_len"] == 1 and e["feat_start"] == 0
    assert len(e["feats"]) == len(e["topk_ids"]) == len(e["lse"]) == TEXT_CHUNK - 1
    np.testing.assert_array_equal(e["feats"], hidden.astype(np.float16))
    best = e["topk_ids"][np.arange(len(e["topk_ids"])), np.argmax(e["topk_vals"], axis=1)]
    np.testing.assert_array_equal(best, np.argmax(logits, axis=1))
    np.testing.assert_allclose(e["lse"], np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1),
                               rtol=1e-5)


def test_stdlib_pieces_are_deterministic_and_sized():
    from speculative.training.data import stdlib_pieces

    def enc(text):
        return [ord(c) % 1000 for c in text]

    a = list(stdlib_pieces(enc, 10 * 64 + 3, seed=1, chunk=64))
    assert len(a) == 10 and all(len(t) == 64 for _, t in a)
    assert a == list(stdlib_pieces(enc, 10 * 64 + 3, seed=1, chunk=64))
    assert [t for _, t in a] != [t for _, t in stdlib_pieces(enc, 10 * 64, seed=2, chunk=64)]


def test_token_subsets_are_nested_and_sized():
    from speculative.training.train import token_subset

    ex = [{"feats": np.zeros((n, 1))} for n in np.random.default_rng(0).integers(5, 50, size=200)]
    small, big = token_subset(ex, 500, 3), token_subset(ex, 2000, 3)
    assert 500 <= sum(len(e["feats"]) for e in small) < 550
    assert 2000 <= sum(len(e["feats"]) for e in big) < 2050
    assert [id(e) for e in big[: len(small)]] == [id(e) for e in small]
    assert len(token_subset(ex, 10**9, 3)) == 200


def test_inference_precision_is_the_higher_estimated_decoding_rate():
    """pick_inference_precision: tokens over (steps x pooled verification time + drafting time)."""
    from speculative.training.train import pick_inference_precision

    def ev(tokens, steps, verify_s, draft_s):
        return {"new_tokens": tokens, "steps": steps, "verify_time_s": verify_s, "draft_time_s": draft_s}

    # the same tau, int8 drafts in a quarter of the time: int8
    choice, info = pick_inference_precision({"fp32": ev(200, 100, 5.0, 2.0), "int8": ev(200, 100, 5.0, 0.5)})
    assert choice == "int8" and info["verify_ms_per_step"] == pytest.approx(50.0)
    assert info["int8_tokens_per_s"] == pytest.approx(200 / 5.5) and info["fp32_tokens_per_s"] == pytest.approx(200 / 7)
    # int8 cheaper but its tau collapses (a third of fp32's accepted tokens): fp32
    assert pick_inference_precision({"fp32": ev(200, 100, 5.0, 2.0), "int8": ev(200, 160, 8.0, 0.8)})[0] == "fp32"
    # noise in one run's verification time does not decide it: v is pooled (here int8's verification ran slow)
    assert pick_inference_precision({"fp32": ev(200, 100, 4.0, 2.0), "int8": ev(200, 100, 7.0, 0.5)})[0] == "int8"
    # a tie keeps the first (fp32)
    assert pick_inference_precision({"fp32": ev(200, 100, 5.0, 1.0), "int8": ev(200, 100, 5.0, 1.0)})[0] == "fp32"
    with pytest.raises(ValueError):
        pick_inference_precision({})


def test_draft_vocab_is_the_fastest_that_loses_no_accepted_draft():
    """pick_draft_vocab: among the sizes whose tau is the whole vocabulary's or more, the highest estimated rate
    (the precision's estimate, v pooled); the larger size on a tie."""
    from speculative.training.train import pick_draft_vocab

    def ev(steps, tau, verify_s, draft_s, new=200):
        return {"new_tokens": new, "steps": steps, "verify_time_s": verify_s, "draft_time_s": draft_s,
                "mean_accepted_tokens": tau}

    # the half drafts faster with the same tau: chosen; the quarter, faster still, loses accepted drafts: not
    choice, info = pick_draft_vocab({16384: ev(100, 2.0, 5.0, 2.0), 8192: ev(100, 2.0, 5.0, 1.5),
                                     4096: ev(102, 1.98, 5.1, 1.0)})
    assert choice == 8192 and info["4096_tokens_per_s"] > info["8192_tokens_per_s"] > info["16384_tokens_per_s"]
    assert info["verify_ms_per_step"] == pytest.approx(1e3 * 15.1 / 302)
    # a smaller size that drafts no faster is not chosen (the whole one wins the tie); one with a higher tau may be
    assert pick_draft_vocab({4096: ev(100, 2.0, 5.0, 1.0), 2048: ev(100, 2.0, 5.0, 1.0)})[0] == 4096
    assert pick_draft_vocab({4096: ev(100, 2.0, 5.0, 1.0), 2048: ev(99, 2.02, 4.95, 1.0)})[0] == 2048
    # the whole vocabulary is always eligible, however slow
    assert pick_draft_vocab({4096: ev(100, 2.0, 5.0, 9.0), 2048: ev(100, 1.9, 5.0, 0.1)})[0] == 4096
    with pytest.raises(ValueError, match="no evaluations"):
        pick_draft_vocab({})


@pytest.mark.parametrize("setting", ["auto", "all", "3000", 3000, "8192"])
def test_recommended_draft_vocab_is_evaluated_and_recorded(tmp_path, monkeypatch, setting):
    """recommend_draft_vocab: which sizes it evaluates (at the chosen precision), what drafter.json records and
    which evaluation it returns, for each setting (evaluate_drafter replaced by a recorder with synthetic results:
    tau falls below 4096 tokens, drafting gets cheaper with fewer)."""
    import speculative.training.recommend as recommend
    from speculative.training.train import TrainConfig, default_head_config

    calls = []

    def fake_eval(target, folder, method, n_prompts=None, precision=None, vocab=None):
        calls.append((precision, vocab))
        n = vocab or 0
        return {"new_tokens": 200, "steps": 100 if n >= 4096 else 110, "verify_time_s": 5.0,
                "draft_time_s": n / 4096, "mean_accepted_tokens": 2.0 if n >= 4096 else 1.8, "acceptance_rate": 0.5,
                "draft_ms_per_token": 1.0, "verify_ms_per_step": 50.0}

    monkeypatch.setattr(recommend, "evaluate_drafter", fake_eval)
    whole = 8195  # --draft-vocab 8192 plus 3 end-of-generation ids
    hcfg = default_head_config("eagle", 64, list(range(whole)), "t", 10000)
    folder = tmp_path / "drafter"
    folder.mkdir()
    heldout = {**fake_eval(None, None, None, vocab=whole), "mean_accepted_tokens": 2.0}
    calls.clear()
    ev, rec = recommend.recommend_draft_vocab("t", folder, hcfg, TrainConfig(draft_vocab=8192, inference_vocab=setting),
                                              "int8", heldout)
    want = {"auto": (4096, [whole, 4096, 2048]), "all": (whole, []), "3000": (3000, [3000]), 3000: (3000, [3000]),
            "8192": (8192, [8192])}[setting]
    assert rec["choice"] == want[0] and [v for _, v in calls] == want[1] and all(p == "int8" for p, _ in calls)
    assert json.loads((folder / "drafter.json").read_text())["extra"]["draft_vocab"] == want[0]
    assert set(rec["heldout"]) == {str(n) for n in (want[1] or [whole])}
    assert ev is heldout if setting == "all" else ev["draft_time_s"] == want[0] / 4096


def test_draft_vocab_rule_on_the_shipped_heads_measurements_gives_its_recommendation():
    """The rule applied to the committed size sweep of the shipped Qwen head (docs/bench/qwen-head-vocab-xeon: 16,384,
    8,192 and 4,096 tokens on the development prompts) recommends what the head's drafter.json says: 8,192 (4,096
    drafts faster but loses accepted drafts)."""
    from speculative.drafters import trained_drafter_dir
    from speculative.training.train import pick_draft_vocab

    sweep = json.loads((Path(__file__).resolve().parents[1] / "docs/bench/qwen-head-vocab-xeon/vocab.json").read_text())["sizes"]
    choice, info = pick_draft_vocab({int(n): e for n, e in sweep.items()})
    shipped = json.loads((trained_drafter_dir("qwen2.5-coder-1.5b-instruct-eagle") / "drafter.json").read_text())
    assert choice == shipped["extra"]["draft_vocab"] == 8192
    assert info["4096_tokens_per_s"] > info["8192_tokens_per_s"]


def test_training_precision_is_resolved_and_checked(tmp_path):
    from speculative.training.train import training_dtype

    assert training_dtype("fp32", "cpu") == "fp32" and training_dtype("bf16", "cpu") == "bf16"
    assert training_dtype("auto", "cpu") in ("fp32", "bf16")
    with pytest.raises(ValueError, match="precision"):
        training_dtype("fp8", "cpu")
    with pytest.raises(ValueError, match="unroll_context must be 'own' or 'target'"):
        train_drafter(TARGET, tmp_path / "run", TrainConfig(unroll_context="chain"), progress=False)
    with pytest.raises(ValueError, match="inference_precision must be 'auto', 'int8' or 'fp32'"):
        train_drafter(TARGET, tmp_path / "run", TrainConfig(inference_precision="fp16"), progress=False)
    with pytest.raises(ValueError, match="inference_vocab must be 'auto', 'all' or a number of tokens from 1 to"):
        train_drafter(TARGET, tmp_path / "run", TrainConfig(inference_vocab="9000"), progress=False)
    with pytest.raises(ValueError, match="inference_vocab must be 'auto', 'all' or a number of tokens from 1 to"):
        train_drafter(TARGET, tmp_path / "run", TrainConfig(inference_vocab=True), progress=False)
    with pytest.raises(ValueError, match="inference_vocab '512': the setting is for EAGLE heads"):
        train_drafter(TARGET, tmp_path / "run", TrainConfig(method="medusa", inference_vocab="512"), progress=False)
    with pytest.raises(ValueError, match="only EAGLE heads choose one"):
        train_drafter(TARGET, tmp_path / "run", TrainConfig(method="medusa", inference_precision="int8"),
                      progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("window", [32, 5])
def test_unrolled_training_steps_see_what_drafting_sees(window):
    """EagleHead.forward_unrolled (EAGLE-3's training-time test) equals drafting through the cache: position j's
    step-s output is what step() gives after the target-fed inputs up to j - s + 1 and the head's own chain."""
    from speculative.drafters.head_nets import EagleHead, HeadCache, HeadConfig

    torch.manual_seed(0)
    cfg = HeadConfig(method="eagle", hidden_size=32, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=48,
                     window=window)
    head = EagleHead(cfg).eval()
    for p in head.parameters():  # o_proj and down start at zero: give every weight a value
        torch.nn.init.normal_(p, std=0.3)
    T, steps = 12, 3
    feats, embeds = torch.randn(1, T, 32), torch.randn(1, T, 32)
    with torch.no_grad():
        outs = head.forward_unrolled(feats, embeds, steps)
        assert torch.allclose(outs[0], head(feats, embeds), atol=1e-5)
        checked = 0
        for s in range(2, steps + 1):
            for j in range(s - 1, T):
                cache = HeadCache()
                first = j - s + 1  # the last position whose input comes from the target's feature
                out = head.step(feats[0, : first + 1], embeds[0, : first + 1], cache)[-1]
                for p in range(first + 1, j + 1):  # the chain: each input is the previous step's output
                    out = head.step(out[None], embeds[0, p : p + 1], cache)[0]
                # equal up to float32 rounding, relative to the vector's scale (outputs reach a few hundred here, and
                # the batched and single-row paths round differently on different CPUs); a wrong context is off by O(1)
                err = (outs[s - 1][0, j] - out).abs().max().item()
                assert err <= 1e-5 * out.abs().max().item(), (s, j, err)
                checked += 1
        # and the context really matters: the older unrolling (every position fed its own prediction) differs
        own = head(torch.cat([feats[:, :1], outs[0][:, :-1]], dim=1), embeds)
        assert not torch.allclose(own[0, 2:], outs[1][0, 2:], atol=1e-3)
    assert checked == (T - 1) + (T - 2)
