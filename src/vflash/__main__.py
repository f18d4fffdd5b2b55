import sys

from vflash.cli import main

sys.exit(main())
