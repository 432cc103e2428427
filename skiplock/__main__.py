import sys

from skiplock.cli import main

sys.exit(main())
