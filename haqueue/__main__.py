"""`python -m haqueue` is the `haqueue` command."""
import sys

from haqueue.cli import main

sys.exit(main())
