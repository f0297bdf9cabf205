"""``python -m bloomline.trainer`` (what torchrun launches)."""

from bloomline.trainer.cli import main

main()
