import sys

from gemmtune.cli import main

sys.exit(main())
