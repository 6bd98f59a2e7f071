"""``python -m labeldp`` is the ``labeldp`` command."""

import sys

from labeldp.cli import main

sys.exit(main())
