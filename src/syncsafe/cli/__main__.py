"""`python -m syncsafe.cli`: the `syncsafe` command."""

import sys

from syncsafe.cli import main

sys.exit(main())
