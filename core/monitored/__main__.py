"""``python -m monitored``: the ``monitored`` command (``python -m monitored plugins``).

The same as the console script, for environments where its directory is not on
``PATH`` (a virtual environment that is not activated).
"""

import sys

from ._cli import main

sys.exit(main())
