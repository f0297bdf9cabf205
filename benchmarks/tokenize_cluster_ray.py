"""The processes ``benchmarks.tokenize_cluster`` runs Ray in: the marked processes whose CPU
time counts as the benchmark's, the 2-node loopback cluster, and the probes that time
``ray.init``/``ray.shutdown`` and the driver's splice inside ``tokenize_corpus``.

Contract: every process of the run carries ``MARK=<token>`` in its environment; the cluster is
ended by process id, never by ``ray stop`` (which would end every Ray process of the machine);
the probes wrap the functions in this process only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter

HEAD, WORKER = "127.0.0.2", "127.0.0.3"
MARK = "BLOOMLINE_BENCH_CLUSTER"  # the environment variable that marks our processes
CLK = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------- our processes


class MarkedProcesses:
    """CPU seconds of every process whose environment carries ``MARK=<token>`` (ours: spawned
    children, Ray's daemons and their workers), this process excepted, dead ones included.

    Ray's raylets do not collect their workers' CPU time when those exit (no ``cutime``), so
    a background thread reads ``/proc`` every ``interval`` seconds and keeps each process's
    last utime + stime: a process that ends is counted up to its last sample (at most
    ``interval`` of its CPU is lost). Reaped children's ``cutime`` is not used (no double
    count).
    """

    def __init__(self, token: str, interval: float = 0.1) -> None:
        self.needle = f"{MARK}={token}".encode()
        self.known: dict[tuple[str, bytes], bool] = {}
        self.last: dict[tuple[str, bytes], int] = {}  # (pid, start time) -> clock ticks
        self.niced: dict[str, int] = {}  # command -> nice value, of those not at 0
        self.overhead = 0.0  # CPU seconds this process spent scanning /proc
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self.thread.start()

    def _run(self, interval: float) -> None:
        while not self.stopped.wait(interval):
            self._scan()

    def _scan(self) -> list[tuple[int, list[bytes]]]:
        found, me = [], os.getpid()
        with self.lock:
            start = time.thread_time()
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) == me:
                    continue
                try:
                    with open(f"/proc/{name}/stat", "rb") as fh:
                        fields = fh.read().rsplit(b")", 1)[1].split()
                    key = (name, fields[19])  # pid and start time: a reused pid is another
                    marked = self.known.get(key)
                    if marked is None:
                        with open(f"/proc/{name}/environ", "rb") as fh:
                            marked = self.needle in fh.read().split(b"\0")
                        self.known[key] = marked
                        if marked and int(fields[16]) != 0:  # nice
                            with open(f"/proc/{name}/cmdline", "rb") as fh:
                                command = fh.read().split(b"\0")[0].decode(errors="replace")
                            self.niced[Path(command).name[:40]] = int(fields[16])
                    if marked:
                        self.last[key] = int(fields[11]) + int(fields[12])  # utime + stime
                        found.append((int(name), fields))
                except (OSError, IndexError):
                    continue  # gone meanwhile, or a zombie
            self.overhead += time.thread_time() - start
        return found

    def cpu_seconds(self) -> float:
        self._scan()
        with self.lock:
            return sum(self.last.values()) / CLK

    def live_seconds(self) -> float:
        """For ``OtherLoad``, which adds this process's CPU and its reaped children's
        (``os.times``) itself: the other processes counted here, less those children (counted
        here already) and this process's own scanning."""
        t = os.times()
        return self.cpu_seconds() - (t.children_user + t.children_system) - self.overhead

    def driver_cpu(self) -> float:
        """This process's CPU seconds, its scanning excepted."""
        t = os.times()
        return t.user + t.system - self.overhead

    def pids(self, exclude_descendants_of: int | None = None) -> list[int]:
        """The live marked processes; without those descending from a process."""
        found = {pid: int(fields[1]) for pid, fields in self._scan()}  # pid -> parent
        if exclude_descendants_of is None:
            return list(found)

        def descends(pid: int) -> bool:
            seen = set()
            while pid > 1 and pid not in seen:
                seen.add(pid)
                if pid == exclude_descendants_of:
                    return True
                try:
                    with open(f"/proc/{pid}/stat", "rb") as fh:
                        pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    return False
            return False
        return [pid for pid in found if not descends(pid)]

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()


# ------------------------------------------------------------------------- Ray cluster


def ray_cli(*args: str, env: dict) -> None:
    ray = Path(sys.executable).parent / "ray"
    done = subprocess.run([str(ray), *args], capture_output=True, text=True, timeout=180,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"ray {args[0]} failed:\n{done.stdout}\n{done.stderr}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    """A head (127.0.0.2) and a worker node (127.0.0.3) of 1 CPU each, on this machine."""

    def __init__(self, marked: MarkedProcesses) -> None:
        self.marked = marked
        self.restarts = 0

    def start(self) -> tuple[float, float]:
        """(seconds to start the head, seconds to start the worker node and join)."""
        # Ray's unix sockets live under the temp dir: keep its path short (108-byte limit)
        self.temp = tempfile.mkdtemp(prefix="raybench", dir="/tmp")
        self.port = free_port()
        self.address = f"{HEAD}:{self.port}"
        start = time.perf_counter()
        ray_cli("start", "--head", "--node-ip-address", HEAD, "--port", str(self.port),
                "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats",
                "--temp-dir", self.temp, env=dict(os.environ))
        head = time.perf_counter() - start
        ray_cli("start", "--address", self.address, "--node-ip-address", WORKER,
                "--num-cpus", "1", env=dict(os.environ))
        return head, time.perf_counter() - start - head

    def alive(self) -> bool:
        """Its GCS and both raylets run (``ray stop`` elsewhere on the machine, e.g. a test
        run's teardown, ends every Ray process, ours too)."""
        names = []
        for pid in self.marked.pids(exclude_descendants_of=os.getpid()):
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
        return names.count("gcs_server") >= 1 and names.count("raylet") >= 2

    def ensure(self) -> None:
        """Start the cluster again if something stopped it (counted in ``restarts``)."""
        if not self.alive():
            print("the Ray cluster was stopped from outside; starting it again", flush=True)
            self.stop()
            self.start()
            self.restarts += 1

    @contextlib.contextmanager
    def watched(self):
        """Abort the benchmark if the cluster dies while a timed run uses it: the driver
        would hang in Ray's reconnect loop (minutes) and the row would be meaningless."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(1.0):
                if not self.alive():
                    print("error: the Ray cluster was stopped from outside (`ray stop` of "
                          "another run?) during a timed run; rerun the benchmark",
                          file=sys.stderr, flush=True)
                    for pid in self.marked.pids():
                        with contextlib.suppress(OSError):
                            if b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                                continue  # multiprocessing's: it ends with this process
                            os.kill(pid, signal.SIGKILL)
                    shutil.rmtree(self.temp, ignore_errors=True)
                    os._exit(3)
        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def stop(self) -> None:
        """End the cluster's processes by their ids (never ``ray stop``, which ends every
        Ray process of the machine, other people's too). Ours are the marked processes that
        do not descend from this one (``ray start`` detaches its daemons)."""
        me = os.getpid()
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            for pid in self.marked.pids(exclude_descendants_of=me):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.marked.pids(me) and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(self.temp, ignore_errors=True)


# ---------------------------------------------------------------------------- probes


@dataclass
class Probes:
    """Seconds spent in wrapped calls of this process since the last reset."""

    splice: float = 0.0  # IndexedDatasetWriter.add_index + finalize
    ray_init: float = 0.0
    ray_shutdown: float = 0.0
    spliced_bytes: int = 0

    def reset(self) -> None:
        self.splice = self.ray_init = self.ray_shutdown = 0.0
        self.spliced_bytes = 0


def install_probes(probes: Probes, ray) -> None:
    add_index, finalize = IndexedDatasetWriter.add_index, IndexedDatasetWriter.finalize
    init, shutdown = ray.init, ray.shutdown

    def timed(fn, attr: str):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(probes, attr, getattr(probes, attr) + time.perf_counter() - start)
        return wrapper

    def add_index_counted(self, path_prefix):
        probes.spliced_bytes += Path(f"{path_prefix}.bin").stat().st_size
        return add_index(self, path_prefix)

    IndexedDatasetWriter.add_index = timed(add_index_counted, "splice")
    IndexedDatasetWriter.finalize = timed(finalize, "splice")
    ray.init = timed(init, "ray_init")  # ray_tasks calls ray.init / ray.shutdown by attribute
    ray.shutdown = timed(shutdown, "ray_shutdown")
