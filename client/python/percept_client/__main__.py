"""python3 -m percept_client --connect tcp://127.0.0.1:5556 …: one JSON line per message (see --help)."""

import sys

from percept_client import main

sys.exit(main())
