"""A real runner whose main thread blocks for good on a prompt that says STUCK
(as a decode that never returns would): its reader thread still answers.

Started as the runner "interpreter" through a wrapper script:
``stuck_runner.py -m jupyter_llm.runner --fd N``.
"""

import sys
import threading

from jupyter_llm.runner import model, serve

_prompt_tokens = model.Model.prompt_tokens


def prompt_tokens(self, prompt, *args, **kwargs):
    if "STUCK" in prompt:
        threading.Event().wait()  # the main thread never comes back
    return _prompt_tokens(self, prompt, *args, **kwargs)


model.Model.prompt_tokens = prompt_tokens
sys.exit(serve.main(sys.argv[sys.argv.index("--fd") :]))
