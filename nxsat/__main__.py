"""``python -m nxsat``: the same as the ``nxsat`` command."""

import sys

from nxsat.cli import main

sys.exit(main())
