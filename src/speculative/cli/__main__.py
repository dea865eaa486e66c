"""``python -m speculative.cli``: the ``speculative`` command."""

import sys

from . import main

sys.exit(main())
