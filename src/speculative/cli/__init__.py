"""Command line: ``speculative generate | serve | check | bench | profile | doctor | ...``.

One module per group of commands (:mod:`.run`, :mod:`.bench`, :mod:`.drafters`), their
shared options (:mod:`.common`) and the parser (:mod:`.parser`). User mistakes print
one line (``error: ...``) and exit with status 2.
"""

from __future__ import annotations

import sys

from ..errors import SpeculativeError
from .parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpeculativeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `speculative generate ... | head`
        return 0
