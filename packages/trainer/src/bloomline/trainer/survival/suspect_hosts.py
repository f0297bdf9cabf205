"""The hosts a run suspects of silent data corruption, where a relaunch reads them:
``RUN/suspect_hosts.txt``, one host name per line, each once, in the order they were named.

Nothing here excludes a host by itself: the run has no spare ranks to move to. The scheduler
does, at the next start::

    srun --exclude="$(paste -sd, RUN/suspect_hosts.txt)" trainer pretrain ...

Also the gather of every rank's host name, which the reports name ranks with.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch.distributed as dist

from bloomline.common.atomic import atomic_write_bytes

__all__ = ["SUSPECT_HOSTS_FILE", "add_suspect_hosts", "gather_from_ranks", "read_suspect_hosts"]

SUSPECT_HOSTS_FILE = "suspect_hosts.txt"


def gather_from_ranks(value) -> list:
    """``value`` (picklable) of every rank, in rank order (collective; one rank: itself)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def host_name() -> str:
    return socket.gethostname()


def read_suspect_hosts(run_dir: str | Path) -> list[str]:
    """The hosts named so far (none when the file does not exist)."""
    path = Path(run_dir) / SUSPECT_HOSTS_FILE
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def add_suspect_hosts(run_dir: str | Path, hosts: list[str]) -> Path:
    """Add ``hosts`` not listed yet to ``RUN/suspect_hosts.txt`` (written whole, atomically);
    returns its path. Called by rank 0 only."""
    listed = read_suspect_hosts(run_dir)
    listed += [host for host in dict.fromkeys(hosts) if host not in listed]
    path = Path(run_dir) / SUSPECT_HOSTS_FILE
    atomic_write_bytes(path, "".join(f"{host}\n" for host in listed).encode())
    return path
