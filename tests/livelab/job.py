"""Run one live-lab training job: ``python tests/livelab/job.py SCENARIO --dir D [--seed N]``.

(The runner starts jobs through this file so that the job's own process imports the lab
from tests/ whatever the working directory.)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from livelab.workloads import main

if __name__ == "__main__":
    sys.exit(main())
