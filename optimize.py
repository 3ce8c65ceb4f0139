#!/usr/bin/env python
"""Compile a halluscope detector: ``python optimize.py --metric iou --lang de`` (see ``--help``).

A thin entry point over ``halluscope.cli.optimize`` (the ``optimize/`` folder installs as ``halluscope.optimize``).
"""

import sys

from halluscope.cli.optimize import main

if __name__ == "__main__":
    sys.exit(main())
