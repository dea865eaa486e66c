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
