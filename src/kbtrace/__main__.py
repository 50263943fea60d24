"""``python -m kbtrace``: the ``kbtrace`` command (``kbtrace.cli.main``)."""

import sys

from kbtrace.cli import main

sys.exit(main())
