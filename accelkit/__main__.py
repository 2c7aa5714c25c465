import sys

from accelkit._cli import main

sys.exit(main())
