import sys

from lingbot_cli.main import main

sys.exit(main())
