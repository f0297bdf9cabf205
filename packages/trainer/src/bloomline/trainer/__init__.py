"""bloomline.trainer: the BLOOM-recipe GPT trainer (model, data, precision, loop, checkpoints).

Entry points: ``trainer`` (cli.py), :class:`bloomline.trainer.loop.Trainer` for code, and
:mod:`bloomline.trainer.model` for the architecture alone. See packages/trainer/README.md.
"""

__all__: list[str] = []
