"""``llm/run_finetune.py`` whose rank 1 SIGKILLs itself right after writing checkpoint ``KILL_AFTER_STEP`` in the
first attempt of an elastic worker group (``TORCHELASTIC_RESTART_COUNT`` 0): a worker dying mid-run, for the
launcher's ``--max_restarts`` test."""

import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from paddlenlp_ext.trainer.trainer import Trainer  # noqa: E402
from tests._scripts import load_script  # noqa: E402

_save = Trainer.save_checkpoint


def _save_then_die(self):
    path = _save(self)
    if (os.environ.get("RANK") == "1" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
            and self.state.global_step == int(os.environ["KILL_AFTER_STEP"])):
        os.kill(os.getpid(), signal.SIGKILL)
    return path


Trainer.save_checkpoint = _save_then_die
mod = load_script("llm/run_finetune.py", "run_finetune_killed")
mod.run_cli(mod.main, resumable=True)
