#!/usr/bin/env python
"""Compile a halluscope detector: ``python optimize.py --metric iou --lang de`` (see ``--help``).

A thin entry point: ``import optimize`` resolves to the ``optimize/`` package beside this file.
"""

import sys

from optimize.cli import main

if __name__ == "__main__":
    sys.exit(main())
