from pathlib import Path

import pytest

from speculative.errors import ModelNotFoundError
from speculative.models import REGISTRY, resolve


def test_registered_models_resolve_to_checked_gguf_files():
    for name in ("smollm2-135m-instruct", "gemma-3-270m"):
        src = resolve(name)
        assert src.kind == "gguf" and Path(src.location).is_file() and src.registered is REGISTRY[name]
        assert Path(src.location).read_bytes()[:4] == b"GGUF"


def test_paths_folders_and_hub_ids(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF....")
    assert resolve(str(f)).kind == "gguf"
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert resolve(str(d)).kind == "hf-dir"
    assert resolve("HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hf-hub"


@pytest.mark.parametrize("spec", ["no-such-model", "./missing.gguf", "/nope/x.gguf", ""])
def test_unknown_models_are_clear_errors(spec):
    with pytest.raises(ModelNotFoundError) as e:
        resolve(spec)
    assert "\n" not in str(e.value)


def test_content_sha256_is_keyed_by_content_and_memoized(tmp_path, monkeypatch):
    """Caches derived from a model file (transformers' de-quantized copy) are keyed by its content: the
    same GGUF in two environments shares one entry; a changed file is hashed again."""
    import hashlib
    import os

    from speculative.cache import content_sha256

    monkeypatch.setenv("SPECULATIVE_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tmp_path / "venv1" / "m.gguf", tmp_path / "venv2" / "m.gguf"
    for p in (a, b):
        p.parent.mkdir()
        p.write_bytes(b"GGUF" * 1000)
    want = hashlib.sha256(b"GGUF" * 1000).hexdigest()
    assert content_sha256(a) == content_sha256(b) == want
    assert len(list((tmp_path / "cache" / "checksums").iterdir())) == 2  # memoized per file version
    a.write_bytes(b"FUGG" * 1000)
    os.utime(a, ns=(1, 1))  # a new version of the file (same size): its own memo entry
    assert content_sha256(a) == hashlib.sha256(b"FUGG" * 1000).hexdigest()
