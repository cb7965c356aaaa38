import sys

from warcore.tools.cli import main

sys.exit(main())
