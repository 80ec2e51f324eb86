"""``python -m vlrl``: the ``vlrl`` command — what ``torchrun --nproc-per-node N -m vlrl train …`` starts on
each rank."""

import sys

from vlrl.cli import main

sys.exit(main())
