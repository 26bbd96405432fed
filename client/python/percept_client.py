"""Runs the Python client from percept's repo: /usr/bin/python3 client/python/percept_client.py --connect … (see --help).

The client is the percept_client package next to this file (client/python/percept_client/); `import
percept_client` finds that package before this script. Installed, `python3 -m percept_client` does the same.
"""

import sys

from percept_client import main

if __name__ == "__main__":
    sys.exit(main())
