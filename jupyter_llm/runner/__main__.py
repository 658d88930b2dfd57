"""Entry point of a runner process: ``python -m jupyter_llm.runner --fd N``."""

import sys

from jupyter_llm.runner.serve import main

sys.exit(main())
