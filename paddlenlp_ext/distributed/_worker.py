"""Entry point of each process that ``paddlenlp_ext.distributed.launch`` starts: ``python -m
paddlenlp_ext.distributed._worker script.py [args]`` runs ``script.py`` as ``__main__`` (as ``python script.py``
would) with its stderr joined to its stdout, so ``workerlog.<rank>`` holds both in the order written (the agent
opens separate files for the two streams)."""

import os
import runpy
import sys


def main() -> None:
    os.dup2(sys.stdout.fileno(), sys.stderr.fileno())
    script, args = sys.argv[1], sys.argv[2:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
