import sys

from gemmtune.cli.main import main

sys.exit(main())
