import sys

from handoffs.cli import main

sys.exit(main())
