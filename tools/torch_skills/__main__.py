"""`python -m torch_skills [options]`: the same as the `torch-skills` command."""

import sys

from torch_skills.cli import main

sys.exit(main())
