"""Checkpoints: ``RUN/checkpoints/step_NNNNNNNN/``, written whole or not at all, verified
before anything in them is loaded.

Modules, in the order a save touches them, then the ones that read checkpoints back:

- ``layout.py``: folder and file names, ``PendingSave``, ``list_checkpoints``;
- ``save.py``: the synchronous save, and its two halves (``begin_save``, ``finish_save``);
- ``dcp_state.py``: the state dict DCP writes and reads (optimizer state by parameter name);
- ``rng_state.py``: the generator states as plain JSON (``rng.json``);
- ``async_save.py``: ``AsyncCheckpointer``, the same save finished in a background thread;
- ``manifest.py``: ``manifest.json`` (sizes and sha256) and ``verify_checkpoint``;
- ``metadata.py``: every pickle read from a checkpoint, through a restricted unpickler;
- ``failure.py``: a save that fails removes its partial folder and says why in one line;
- ``discovery.py``: ``latest_checkpoint``, the newest checkpoint of a run that verifies;
- ``compatibility.py``: the config a checkpoint was written with, the settings a resume
  cannot change and the ones it takes from this run;
- ``load.py``: ``load_checkpoint``, verified first, then DCP, the RNG and trainer states;
- ``tokenizer_copy.py``: the run's tokenizer files kept in the run folder and each checkpoint,
  and which tokenizer a loaded checkpoint uses;
- ``path_kind.py``: what a path given as a checkpoint really is, said in one line by every
  command that takes one (a run folder's latest checkpoint for the reading commands).

The trainer's side (resume choice, what a load re-applies, saves and waits) is
``trainer/run_checkpoints.py``: this package knows checkpoints, not runs.

This package re-exports the names callers use; tests that monkeypatch a name patch the
module that defines it.
"""

from bloomline.trainer.checkpoint.async_save import AsyncCheckpointer
from bloomline.trainer.checkpoint.compatibility import (
    changed_settings,
    check_compatible,
    load_config_of,
)
from bloomline.trainer.checkpoint.dcp_state import saved_state_dict
from bloomline.trainer.checkpoint.discovery import latest_checkpoint
from bloomline.trainer.checkpoint.layout import CONFIG_FILE, list_checkpoints
from bloomline.trainer.checkpoint.load import load_checkpoint
from bloomline.trainer.checkpoint.manifest import (
    MANIFEST,
    describe_checkpoint,
    verify_checkpoint,
    write_manifest,
)
from bloomline.trainer.checkpoint.save import save_checkpoint
from bloomline.trainer.checkpoint.tokenizer_copy import (
    copied_tokenizer,
    inference_tokenizer,
    tokenizer_copy_files,
)

__all__ = ["AsyncCheckpointer", "CONFIG_FILE", "MANIFEST",
           "changed_settings", "check_compatible", "copied_tokenizer", "describe_checkpoint",
           "inference_tokenizer", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
           "load_config_of", "save_checkpoint", "saved_state_dict", "tokenizer_copy_files",
           "verify_checkpoint", "write_manifest"]
