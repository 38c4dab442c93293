"""The launchers: installed as console scripts (``[project.scripts]`` in ``pyproject.toml``) and run by the scripts
in ``llm/`` (``python llm/run_finetune.py config.json`` is ``paddlenlp-finetune config.json``).

Each module has ``main(argv=None)``: parse ``argv`` (``sys.argv[1:]`` when None), run, return the summary dict or
the exit status; bad input raises ValueError / FileNotFoundError / NotADirectoryError naming the key, file or path.
Its ``cli()`` is the command: ``main`` on ``sys.argv`` through :func:`paddlenlp_ext.trainer.launch.run_cli` (one
``error:`` line and exit 2 for bad input, exit 130 on Ctrl-C, 143 on SIGTERM).

=============================================  ========================================
command                                        module
=============================================  ========================================
``paddlenlp-finetune``                         :mod:`paddlenlp_ext.cli.run_finetune`
``paddlenlp-dpo``                              :mod:`paddlenlp_ext.cli.run_dpo`
``paddlenlp-reward``                           :mod:`paddlenlp_ext.cli.run_reward`
``paddlenlp-pretrain``                         :mod:`paddlenlp_ext.cli.run_pretrain`
``paddlenlp-predict``                          :mod:`paddlenlp_ext.cli.predict`
``paddlenlp-merge-lora``                       :mod:`paddlenlp_ext.cli.merge_lora_params`
``paddlenlp-create-pretraining-data``          :mod:`paddlenlp_ext.cli.create_pretraining_data`
``paddlenlp-launch``                           :mod:`paddlenlp_ext.distributed.launch`
=============================================  ========================================
"""

from __future__ import annotations

import importlib.util


def load_into(namespace: dict, module: str) -> None:
    """Run the source of ``module`` (e.g. ``"paddlenlp_ext.cli.predict"``) in ``namespace``, the globals of a
    script in ``llm/``: as ``runpy`` with the script's own namespace, so the script's module holds the launcher's
    functions and classes (under the script's ``__name__``) and they read the script's globals. A caller that
    imports the script and replaces one of its names (``mod.build_model = ...``) changes what ``mod.main`` calls,
    as when the code lived in the script.

    Raises:
        ModuleNotFoundError: ``module`` is not importable (the package is not installed or not on ``sys.path``).
    """
    spec = importlib.util.find_spec(module)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_code"):
        raise ModuleNotFoundError(f"{module} not found: install the project (pip install -e .) or run from its root")
    exec(spec.loader.get_code(module), namespace)
