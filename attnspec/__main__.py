"""`python -m attnspec` = the `attnspec` command."""
import sys

from attnspec.cli import main

sys.exit(main())
