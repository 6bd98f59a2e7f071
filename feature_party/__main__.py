"""``python -m feature_party serve|worker|jobs …`` (same as ``labeldp feature-party``)."""

import sys

from feature_party.cli import main

sys.exit(main())
