"""Builds the percept_client package with the wire schemas inside it (pyproject.toml holds the rest).

In percept's repo the schemas are copied from its configs/ (as tools/build-client.mjs does), so the
package always carries the repo's. A copy of this folder made elsewhere must already hold them in
percept_client/schemas/; without them the build fails rather than make a package that cannot validate.
"""

import glob
import os
import shutil

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "..", "configs")
SCHEMAS = os.path.join(HERE, "percept_client", "schemas")

if os.path.isfile(os.path.join(HERE, "..", "index.ts")) and os.path.isdir(os.path.join(CONFIGS, "wire")):
    shutil.rmtree(SCHEMAS, ignore_errors=True)
    for folder in ("wire", "actions"):
        os.makedirs(os.path.join(SCHEMAS, folder))
        for path in glob.glob(os.path.join(CONFIGS, folder, "*.schema.json")):
            shutil.copy(path, os.path.join(SCHEMAS, folder))
if not os.path.isfile(os.path.join(SCHEMAS, "wire", "header.schema.json")):
    raise SystemExit("percept_client: no schemas in %s: build from percept's repo, or run `node tools/build-client.mjs` there "
                     "before copying client/python" % SCHEMAS)

setup()
