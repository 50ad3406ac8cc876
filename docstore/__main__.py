from __future__ import annotations

import sys

from docstore.server import main

sys.exit(main())
