"""The on-disk cache folder: assembled models, converted weights, numerics checks.

``$SPECULATIVE_CACHE_DIR`` overrides the default ``~/.cache/speculative``.
Everything written here is written atomically (temporary name, then rename),
so an interrupted run never leaves a partial file behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The cache folder (or a sub-folder of it), created on demand."""
    base = Path(os.environ.get("SPECULATIVE_CACHE_DIR") or Path.home() / ".cache" / "speculative")
    p = base.joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def file_key(path: str | os.PathLike) -> str:
    """A short key that changes when the file at ``path`` changes (path, size, mtime)."""
    st = os.stat(path)
    raw = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def content_sha256(path: str | os.PathLike) -> str:
    """sha256 of the file's content, computed once per file version (memoized under ``checksums/`` by
    :func:`file_key`), so that caches derived from a file can be keyed by what it holds, not where it lies."""
    digest = read_json(_sha256_memo(path)).get("sha256")
    if not digest:
        digest = sha256_file(path)
        remember_sha256(path, digest)
    return digest


def remember_sha256(path: str | os.PathLike, digest: str) -> None:
    """Record a digest just computed while writing ``path`` (so :func:`content_sha256` need not hash it again)."""
    write_json_atomic(_sha256_memo(path), {"path": str(path), "sha256": digest})


def _sha256_memo(path: str | os.PathLike) -> Path:
    return cache_dir("checksums") / f"{file_key(path)}.json"


def read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_path(final: Path):
    """Yield a temporary path beside ``final``; rename it to ``final`` on success, delete it on failure.

    Works for files and folders.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    try:
        yield tmp
        if final.is_dir():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
