"""``python -m hf_rstitch ...`` is the ``rstitch`` command (for venvs whose scripts are not on PATH)."""

import sys

from hf_rstitch.cli.main import main

sys.exit(main())
