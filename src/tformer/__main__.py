"""`python -m tformer ...` (and `torchrun ... -m tformer train ...`): the command line."""

import sys

from tformer.commands.cli import main

sys.exit(main())
