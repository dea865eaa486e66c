"""The command line: output formats and every bad input of the engine issue (one line, exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from speculative.cli import main

LONG_PROMPT = "word " * 400


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json(capsys):
    code, out, err = run_cli(capsys, "generate", "Name three colors.", "--max-new-tokens", "12", "--json", "--drafter", "ngram")
    assert code == 0
    obj = json.loads(out)
    assert set(obj) == {"text", "token_ids", "finish_reason", "stats"}
    assert obj["finish_reason"] in ("stop", "length") and 1 <= len(obj["token_ids"]) <= 12
    s = obj["stats"]
    for key in ("steps", "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_tokens", "accept_counts",
                "new_tokens", "prefill_time_s", "draft_time_s", "verify_time_s", "wall_time_s", "tokens_per_second",
                "decode_tokens_per_second"):
        assert key in s, key
    assert s["new_tokens"] == len(obj["token_ids"])


def test_generate_text_and_summary(capsys):
    code, out, err = run_cli(capsys, "generate", "Say hello.", "--max-new-tokens", "8", "--drafter", "none")
    assert code == 0 and out.strip()
    # drafter none: nothing verified, so no acceptance rate to speak of
    assert "tok/s" in err and "no draft token verified" in err and "tokens/step" in err
    assert "acceptance rate" not in err


@pytest.mark.quick
def test_drafter_none_equals_plain_and_no_chat(capsys):
    """The CLI's speculative output equals its plain output on a raw (--no-chat) prompt whose repetition
    the n-gram drafter picks up: drafts verified (fixed policy), some accepted and some rejected."""
    prompt = "Alice has a cat. Bob has a dog. Alice has a cat. Bob has"
    common = ["generate", prompt, "--no-chat", "--max-new-tokens", "16", "--json"]
    _, a, _ = run_cli(capsys, *common, "--drafter", "none")
    _, b, _ = run_cli(capsys, *common, "--drafter", "ngram,min=1,max=3", "--k", "3", "--draft-policy", "fixed")
    plain, spec = json.loads(a), json.loads(b)
    assert spec["token_ids"] == plain["token_ids"] and len(plain["token_ids"]) == 16
    s = spec["stats"]
    assert 0 < s["accepted_tokens"] < s["draft_tokens"], s


@pytest.mark.quick
@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["generate", "hi", "--target", "no-such-model"], "unknown model 'no-such-model'"),
        (["generate", "hi", "--target", "{missing}/model.gguf"], "no model file or folder at {missing}/model.gguf"),
        (["generate", "hi", "--target", "missing.gguf"], "no model file or folder at missing.gguf"),
        (["generate", "   "], "prompt is empty"),
        (["generate", "hi", "--k", "0"], "num_speculative_tokens"),
        (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
        (["generate", "hi", "--temperature", "-1"], "temperature"),
        (["generate", "hi", "--top-p", "0"], "top_p"),
        (["generate", "hi", "--top-p", "1.5"], "top_p"),
        (["generate", "hi", "--top-k", "-2"], "top_k"),
        (["generate", "hi", "--drafter", "bogus"], "unknown drafter type"),
        (["generate", "hi", "--drafter", "auto,min=2"], "'auto' (the target's recommended drafter) takes no options"),
        (["generate", "hi", "--drafter", "model:gemma-3-270m,vocab=same"], "another tokenizer"),
        (["generate", "hi", "--threads", "0"], "threads"),
        (["generate", "hi", "--threads", "999"], "threads must be between 1 and"),
        (["generate", LONG_PROMPT, "--ctx-size", "128", "--no-chat"], "context window"),
        (["generate", "hi", "--backend", "llama.cpp", "--target", "HuggingFaceTB/SmolLM2-135M-Instruct"], "GGUF"),
    ],
)
def test_bad_input_is_one_clear_line(capsys, tmp_path, argv, fragment):
    missing = str(tmp_path / "missing")  # surely absent, unlike a fixed path such as /nonexistent
    argv = [a.replace("{missing}", missing) for a in argv]
    fragment = fragment.replace("{missing}", missing)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0]
    assert "Traceback" not in err


@pytest.mark.quick
def test_corrupt_model_file(capsys, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    code, _, err = run_cli(capsys, "generate", "hi", "--target", str(bad))
    assert code == 2 and "could not load" in err and len(err.strip().splitlines()) == 1
    notgguf = tmp_path / "model.gguf"
    notgguf.write_text("hello")
    code, _, err = run_cli(capsys, "generate", "hi", "--target", str(notgguf))
    assert code == 2 and "not a GGUF file" in err


def test_draft_model_with_short_context_stays_lossless(capsys):
    """A draft model whose window (64) is shorter than the context slides and never crashes."""
    prompt = "Write a long story about a lighthouse keeper and a storm, with many details."
    _, a, _ = run_cli(capsys, "generate", prompt, "--max-new-tokens", "80", "--json", "--drafter", "none")
    code, b, err = run_cli(capsys, "generate", prompt, "--max-new-tokens", "80", "--json", "--k", "4",
                           "--draft-policy", "fixed", "--drafter", "model:smollm2-135m-instruct,ctx=64")
    assert code == 0, err
    assert json.loads(a)["token_ids"] == json.loads(b)["token_ids"]
    assert json.loads(b)["stats"]["accepted_tokens"] > 0


@pytest.mark.quick
def test_console_script_and_models_listing():
    r = subprocess.run([sys.executable, "-m", "speculative.cli", "models"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "smollm2-135m-instruct" in r.stdout and "gemma-3-270m" in r.stdout
    r = subprocess.run([sys.executable, "-m", "speculative.cli", "generate", "hi", "--k", "-1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_doctor_reports_exact_build(capsys):
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 0, out
    assert "bitwise identical" in out and "verdict: all good" in out


def test_doctor_flags_a_build_without_the_attention_kernel(capsys, monkeypatch):
    """A build older than the patch's seventh version (no ggml_bimm_f16_dot) is named as a problem, with the fix."""
    from speculative import kernels

    if not kernels.kernel_info().batch_invariant_mm:
        pytest.skip("llama-cpp-python is not the batch-invariant build (scripts/setup.sh builds it)")
    monkeypatch.setattr(kernels, "has_batch_invariant_attention", lambda: False)
    code, out, _ = run_cli(capsys, "doctor", "--quick")
    line = next(l for l in out.splitlines() if "attention" in l and "ggml_bimm_f16_dot" in l)
    assert "not batch-invariant" in line and "verdict: all good" not in out


def test_make_drafter(capsys, tmp_path):
    out = tmp_path / "d.gguf"
    code, text, err = run_cli(capsys, "make-drafter", "--output", str(out), "--quant", "q4_0", "--drop-layers", "6")
    assert code == 0, err and out.is_file()
    from speculative.derive import block_count

    assert block_count(out) == 30 - 6
    code, _, err = run_cli(capsys, "make-drafter", "--output", str(out))
    assert code == 2 and "exists" in err


@pytest.mark.quick
def test_drafter_tools_bad_input(capsys, tmp_path):
    """import-drafter, export-drafter and train-drafter: one-line errors, nothing deleted or half-written."""

    def err_of(*argv):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and "Traceback" not in err, err
        return err

    assert "does not exist" in err_of("import-drafter", str(tmp_path / "nope"), "-o", str(tmp_path / "o1"))
    bad = tmp_path / "badjson"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert "not valid JSON" in err_of("import-drafter", str(bad), "-o", str(tmp_path / "o2"))
    (bad / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    assert "no weights found" in err_of("import-drafter", str(bad), "-o", str(tmp_path / "o3"))
    assert not any((tmp_path / n).exists() for n in ("o1", "o2", "o3"))
    assert "import-drafter" in err_of("generate", "Hi", "--drafter", f"eagle:{bad}")
    assert "kind 'draft-model'" in err_of("export-drafter", "smollm2-135m-instruct-draft", "--format", "eagle",
                                         "-o", str(tmp_path / "o4"))
    assert "--k must be >= 1" in err_of("export-drafter", "smollm2-135m-instruct-eagle", "--format", "speculators",
                                        "-o", str(tmp_path / "o5"), "--k", "0")
    # train-drafter never deletes or writes into a folder that is not its own run folder
    keep = tmp_path / "precious"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    assert "not a training run folder" in err_of("train-drafter", "--method", "eagle", "-o", str(keep), "--fresh")
    assert (keep / "notes.txt").read_text() == "mine"
    assert "the option is for EAGLE heads" in err_of("train-drafter", "--method", "medusa", "-o", str(tmp_path / "o9"),
                                                     "--inference-precision", "int8")
    assert "the option is for EAGLE heads" in err_of("train-drafter", "--method", "draft-model", "-o",
                                                     str(tmp_path / "o9"), "--inference-precision", "fp32")
    assert "the setting is for EAGLE heads" in err_of("train-drafter", "--method", "medusa", "-o", str(tmp_path / "o9"),
                                                      "--inference-vocab", "all")
    for bad_vocab in ("half", "0", "-5", "9000"):  # more than the trained --draft-vocab (8192 by default)
        assert f"--inference-vocab must be 'auto', 'all' or a number of tokens from 1 to the trained draft vocabulary " \
               f"(8192), got '{bad_vocab}'" in err_of("train-drafter", "--method", "eagle", "-o", str(tmp_path / "o9"),
                                                     f"--inference-vocab={bad_vocab}")
    assert "only EAGLE heads unroll" in err_of("train-drafter", "--method", "medusa", "-o", str(tmp_path / "o9"),
                                               "--unroll-context", "target")
    assert not (tmp_path / "o9").exists()
    assert "drafter option 'precision' is given twice" in err_of(
        "generate", "hi", "--drafter", "eagle:smollm2-135m-instruct-eagle,precision=int8,precision=fp32")
    run = tmp_path / "run-damaged"  # a run folder whose configuration was damaged: named, left as it is
    run.mkdir()
    (run / "train_config.json").write_text("{half")
    assert f"{run / 'train_config.json'}: damaged training configuration" in err_of(
        "train-drafter", "--method", "eagle", "-o", str(run))
    assert (run / "train_config.json").read_text() == "{half"
    assert "--data-from" in err_of("train-drafter", "--method", "eagle", "-o", str(tmp_path / "o6"),
                                   "--data-from", str(tmp_path / "nope"))
    assert "unknown model" in err_of("train-drafter", "--method", "eagle", "-o", str(tmp_path / "o7"), "--target", "nosuch")
    assert "not a torch device" in err_of("train-drafter", "--method", "eagle", "-o", str(tmp_path / "o8"),
                                          "--device", "gpu0")
    import torch

    if not torch.cuda.is_available():
        assert "no CUDA device" in err_of("train-drafter", "--method", "eagle", "-o", str(tmp_path / "o8"),
                                          "--device", "cuda")
    assert "--parallel must be >= 1" in err_of("train-drafter", "--method", "eagle", "-o", str(tmp_path / "o8"),
                                               "--parallel", "0")
    assert not any((tmp_path / n).exists() for n in ("nope", "o6", "o7", "o8"))


def test_serve_refuses_a_busy_port_before_loading(capsys, monkeypatch):
    """A port another process holds: one line, exit 2, and no model loaded first."""
    import socket

    import speculative.cli.run as run_mod

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(run_mod, "_load_generator", no_load)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, _, err = run_cli(capsys, "serve", "--port", str(port))
    assert code == 2 and err.strip().splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    code, _, err = run_cli(capsys, "serve", "--host", "no-such-host.invalid", "--port", "8000")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--host no-such-host.invalid" in err


def test_server_runs_on_the_bound_socket(monkeypatch):
    """run_server serves on the socket listening_socket bound (the path `speculative serve` takes)."""
    import threading
    import time

    import httpx
    import uvicorn

    from speculative import SpeculativeGenerator
    from speculative.server import listening_socket, run_server

    servers = []

    class Recorded(uvicorn.Server):  # to stop it at the end
        def __init__(self, config):
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(uvicorn, "Server", Recorded)
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram", n_ctx=512)
    t = threading.Thread(target=run_server, args=(gen, "m", "127.0.0.1", port), kwargs={"sock": sock, "log_level": "error"},
                         daemon=True)
    t.start()
    r = None
    try:
        for _ in range(100):
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert r is not None and r.status_code == 200 and r.json()["data"][0]["id"] == "m"
    finally:
        for srv in servers:
            srv.should_exit = True
        t.join(timeout=30)
        gen.close()
    assert not t.is_alive() and sock.fileno() == -1  # stopped, and its socket closed
