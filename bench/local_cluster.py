"""A pipetrain-coordinator and pipetrain-worker processes on loopback, for the control-plane
benchmarks (control_plane_overhead.py, submit_to_first_step.py). Standard library only.

    with LocalCluster(build_dir, workers=4) as cluster:
        cluster.wait_for_idle_workers(4)
        cluster.cli(["submit", "job.yaml", "--follow"])

The coordinator gets a fresh SQLite file in a temporary folder and port 0; its address is
read from the file it writes with --port-file. Every line the daemons print on stderr is kept
with the time.monotonic() at which it was read (`lines`), so a benchmark can place worker
log lines ("running rank R of job-0001") on its own clock. Every process is killed on exit,
also when the script is killed (SIGTERM, or SIGKILL: the daemons get SIGKILL when it dies).
"""
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time


try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # looked up once, before any fork
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent():
    """In the child before exec: SIGKILL when the process that started it ends (Linux)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def binaries(build_dir):
    """(pipetrain, pipetrain-coordinator, pipetrain-worker) under a build folder."""
    paths = (os.path.join(build_dir, "client", "pipetrain"),
             os.path.join(build_dir, "coordinator", "pipetrain-coordinator"),
             os.path.join(build_dir, "worker", "pipetrain-worker"))
    for path in paths:
        if not os.access(path, os.X_OK):
            raise SystemExit(f"not an executable: {path} (build it with the daemons on: "
                             f"ninja -C {build_dir} pipetrain pipetrain-coordinator "
                             f"pipetrain-worker)")
    return paths


class LocalCluster:
    def __init__(self, build_dir, workers, heartbeat_ms=1000, extra_env=None):
        self.heartbeat_ms = heartbeat_ms
        self.named = {}  # process name -> Popen (the latest of that name)
        self.cli_path, self.coordinator_path, self.worker_path = binaries(build_dir)
        self.dir = tempfile.mkdtemp(prefix="pipetrain_bench_cluster_")
        self.env = dict(os.environ, **(extra_env or {}))
        self.procs = []
        self.lines = []  # (monotonic seconds, process name, line)
        self._lock = threading.Lock()
        self._threads = []
        self.address = None
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so that close() runs
        try:
            self.address = self.start_coordinator("127.0.0.1:0")
            for i in range(workers):
                self.start_worker(f"worker{i}")
        except BaseException:
            self.close()
            raise

    def start_coordinator(self, listen):
        """Starts the coordinator on `listen` with the cluster's database; its address."""
        port_file = os.path.join(self.dir, "coordinator.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        coordinator = self._spawn("coordinator", [
            self.coordinator_path, "--listen", listen, "--db",
            os.path.join(self.dir, "jobs.db"), "--heartbeat-ms", str(self.heartbeat_ms),
            "--port-file", port_file])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(port_file):
                with open(port_file) as f:
                    text = f.read()  # written whole or not at all
                if text.endswith("\n"):
                    return text.splitlines()[0]  # then "metrics HOST:PORT"
            if coordinator.poll() is not None:
                break
            time.sleep(0.02)
        raise SystemExit("the coordinator did not start:\n" + self.log("coordinator"))

    def restart_coordinator(self):
        """SIGKILLs the coordinator and starts it again on the same port and database."""
        old = self.named["coordinator"]
        old.kill()
        old.wait()
        self.start_coordinator(self.address)

    def start_worker(self, name):
        """Starts a worker named `name` (its log and port file are named after it). Its jobs
        may name any file this user can read (`--data-root /`, as `pipetrain run`'s local
        cluster does): the benchmarks' checkpoints live in their own folders."""
        return self._spawn(name, [self.worker_path, "--coordinator", self.address,
                                  "--data-root", "/",
                                  "--port-file", os.path.join(self.dir, f"{name}.port")])

    def worker_ports(self, name):
        """(service port, metrics port) of worker `name`, from its port file."""
        with open(os.path.join(self.dir, f"{name}.port")) as f:
            lines = f.read().splitlines()
        service = int(lines[0].rsplit(":", 1)[1])
        metrics = [int(line.rsplit(":", 1)[1]) for line in lines[1:] if line.startswith("metrics ")]
        return service, (metrics[0] if metrics else -1)

    def _spawn(self, name, argv):
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=self.env,
                                preexec_fn=_die_with_parent)
        self.procs.append(proc)
        self.named[name] = proc

        def read():
            for line in proc.stderr:
                with self._lock:
                    self.lines.append((time.monotonic(), name, line.rstrip("\n")))
        t = threading.Thread(target=read, daemon=True)
        t.start()
        self._threads.append(t)
        return proc

    def metrics_addresses(self):
        """HOST:PORT of the /metrics endpoint of the coordinator and of every worker that
        has registered (the "metrics" line of their port files)."""
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".port"):
                with open(os.path.join(self.dir, name)) as f:
                    for line in f.read().splitlines():
                        if line.startswith("metrics "):
                            out.append(line.split(" ", 1)[1])
        return out

    def log(self, name):
        with self._lock:
            return "\n".join(line for _, n, line in self.lines if n == name)

    def lines_matching(self, pattern, since=0.0):
        """[(monotonic time, process name, match)] of daemon lines read after `since`."""
        regex = re.compile(pattern)
        with self._lock:
            found = [(t, n, regex.search(line)) for t, n, line in self.lines if t >= since]
        return [(t, n, m) for t, n, m in found if m]

    def cli(self, args, timeout=600, check=True):
        """Runs `pipetrain ARGS --coordinator ADDRESS`; returns the CompletedProcess."""
        cmd = [self.cli_path] + args + ["--coordinator", self.address]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout, env=self.env)
        if check and done.returncode != 0:
            raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}\n"
                             f"coordinator log:\n{self.log('coordinator')[-4000:]}")
        return done

    def idle_workers(self):
        out = self.cli(["workers", "-o", "json"], check=False).stdout
        return sum(1 for line in out.splitlines()
                   if line.strip() and json.loads(line).get("state") == "WORKER_STATE_IDLE")

    def wait_for_idle_workers(self, n, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.idle_workers() >= n:
                return
            time.sleep(0.1)
        raise SystemExit(f"fewer than {n} idle workers after {timeout} s")

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
