"""``python -m cselab`` (also what ``torchrun -m cselab`` runs)."""

import sys

from .cli import main

sys.exit(main())
