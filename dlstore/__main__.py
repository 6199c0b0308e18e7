import sys

from dlstore.cli import main

sys.exit(main())
