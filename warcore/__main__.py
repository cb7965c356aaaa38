import sys

from warcore.cli import main

sys.exit(main())
