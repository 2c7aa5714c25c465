"""``python -m accelkit.sdk.testing.distributed_cases SCENARIO [ARGS]``: one rank's run of a scenario."""

import sys

from accelkit.sdk.testing.distributed_cases import main

sys.exit(main(sys.argv[1:]))
