"""What the data pipeline and the trainer share: errors, atomic outputs, progress."""

from bloomline.common.atomic import (
    atomic_output_dir,
    atomic_write_bytes,
    check_can_write,
    publish,
)
from bloomline.common.errors import SettingError, UserError, exit_on_user_error
from bloomline.common.progress import Counter, Progress, format_duration

__all__ = [
    "Counter",
    "Progress",
    "SettingError",
    "UserError",
    "atomic_output_dir",
    "atomic_write_bytes",
    "check_can_write",
    "exit_on_user_error",
    "format_duration",
    "publish",
]
