"""`python -m jaxattn`: the `jaxattn` command."""

import sys

from .cli import run

sys.exit(run())
