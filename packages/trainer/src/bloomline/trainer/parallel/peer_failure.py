"""A rank's collective that failed because another rank of the run ended.

When one rank stops with an error (a full disk under its shard, a bad file it alone read, a
``kill -9``), the others are usually inside a collective with it and get gloo's or NCCL's
error ("Connection closed by peer ... remote worker crashing"): a traceback of a hundred lines
that says nothing about the cause, printed before or after the failing rank's own one-line
error. ``pretrain`` turns these into one line pointing at the other rank's error; the launcher
then reports the first failure (``launch._first_failure``).
"""

from __future__ import annotations

__all__ = ["peer_failure"]

# what torch's backends raise when the process at the other end of a collective is gone
_DISTRIBUTED_ERRORS = ("DistBackendError", "DistNetworkError")
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe",
              "remote worker crashing", "remote process exited")


def peer_failure(error: BaseException) -> str:
    """What says that ``error`` (or an exception it was raised from or while handling) is a
    collective's failure because another process of the run went away ("connection closed
    by peer", or the torch error's type name); "" when it is not one."""
    seen, todo = set(), [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        text = str(current).lower()
        if isinstance(current, RuntimeError):
            for phrase in _PEER_GONE:
                if phrase in text:
                    return phrase
        if type(current).__name__ in _DISTRIBUTED_ERRORS:
            return type(current).__name__
        todo += [current.__cause__, current.__context__]
    return ""
