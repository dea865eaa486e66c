"""Exceptions raised by `speculative`.

Every error a user can cause (bad option, missing model, prompt too long, ...)
is a :class:`SpeculativeError`. The command line prints its message as one line
and exits with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SpeculativeError(Exception):
    """Base class of user-facing errors (bad input or environment)."""


class ConfigError(SpeculativeError, ValueError):
    """An invalid setting: k < 1, temperature < 0, top_p outside (0, 1], ..."""


class ModelNotFoundError(SpeculativeError, FileNotFoundError):
    """A model name, path or package that cannot be resolved."""


class ModelLoadError(SpeculativeError):
    """A model file that exists but cannot be loaded (corrupt, wrong format)."""


class VocabularyMismatchError(SpeculativeError):
    """A draft model whose vocabulary differs from the target's."""


class ContextOverflowError(SpeculativeError):
    """A prompt that does not fit in the target's context window."""


class BackendUnavailableError(SpeculativeError):
    """A backend whose Python package is not installed or cannot run here."""
