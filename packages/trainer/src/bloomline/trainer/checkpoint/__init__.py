"""Checkpoints: ``RUN/checkpoints/step_NNNNNNNN/``, written whole or not at all, verified
before anything in them is loaded.

Modules, in the order a save touches them:

- ``layout.py``: folder and file names, ``PendingSave``, ``list_checkpoints``;
- ``save.py``: the synchronous save, ``latest_checkpoint``, loading, config compatibility;
- ``async_save.py``: ``AsyncCheckpointer``, the same save finished in a background thread;
- ``manifest.py``: ``manifest.json`` (sizes and sha256) and ``verify_checkpoint``;
- ``metadata.py``: every pickle read from a checkpoint, through a restricted unpickler;
- ``failure.py``: a save that fails removes its partial folder and says why in one line;
- ``tokenizer_copy.py``: the run's tokenizer files kept in the run folder and each checkpoint,
  and which tokenizer a loaded checkpoint uses;
- ``run_checkpoints.py``: ``RunCheckpoints``, the trainer's side (resume choice, what a load
  re-applies, saves and waits).

This package re-exports the names callers use; tests that monkeypatch a name patch the
module that defines it.
"""

from bloomline.trainer.checkpoint.async_save import AsyncCheckpointer
from bloomline.trainer.checkpoint.layout import CONFIG_FILE, list_checkpoints
from bloomline.trainer.checkpoint.manifest import (
    MANIFEST,
    describe_checkpoint,
    verify_checkpoint,
    write_manifest,
)
from bloomline.trainer.checkpoint.run_checkpoints import Loaded, RunCheckpoints
from bloomline.trainer.checkpoint.save import (
    changed_settings,
    check_compatible,
    latest_checkpoint,
    load_checkpoint,
    load_config_of,
    save_checkpoint,
    saved_state_dict,
)
from bloomline.trainer.checkpoint.tokenizer_copy import (
    copied_tokenizer,
    inference_tokenizer,
    tokenizer_copy_files,
)

__all__ = ["AsyncCheckpointer", "CONFIG_FILE", "MANIFEST", "Loaded", "RunCheckpoints",
           "changed_settings", "check_compatible", "copied_tokenizer", "describe_checkpoint",
           "inference_tokenizer", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
           "load_config_of", "save_checkpoint", "saved_state_dict", "tokenizer_copy_files",
           "verify_checkpoint", "write_manifest"]
