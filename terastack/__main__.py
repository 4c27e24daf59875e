import sys

from terastack.cli import main

sys.exit(main())
