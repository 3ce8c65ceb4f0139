import sys

from halluscope.cli import main

sys.exit(main())
