"""A one-node SLURM cluster for tests: munged, slurmctld and slurmd as plain processes.

Everything lives in one temporary directory: a fresh munge key, a generated `slurm.conf`
(this machine is the only node; its name, CPUs and memory come from `slurmd -C`; one
stand-in GPU), state,
spool, logs and the munge socket. No systemd, no accounting database (`sacct` is off, as on
many small clusters), `proctrack/linuxproc` and `task/none` so no cgroup setup is needed.
The controller and node talk over 127.0.0.1 on two free ports, so the cluster does not
clash with another one on the same machine. Clients find it through `SLURM_CONF`.

    cluster = SlurmCluster.start(tmp_dir)     # waits until the node is idle
    subprocess.run(["sbatch", ...], env=cluster.env)
    cluster.stop()                            # ends the three daemons by PID

A user can bring up the same cluster on a laptop (see docs/cluster.md, "Try it on a laptop").
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
PACKAGES = "slurmctld slurmd slurm-client munge"
KILL_WAIT_S = 10  # seconds between SIGTERM and SIGKILL at a time limit or scancel


def _which(name: str) -> str | None:
    """Daemons live in sbin, which is often not on a normal user's PATH."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def missing_programs() -> list[str]:
    """The SLURM/munge programs this machine lacks (empty when the fixture can run)."""
    return [name for name in DAEMONS + CLIENTS if _which(name) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_definition() -> str:
    """This machine as a SLURM node line: `slurmd -C` reads the hostname, CPUs and memory."""
    out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True,
                         check=True).stdout
    return out.splitlines()[0]  # "NodeName=host CPUs=2 ... RealMemory=24105"


def slurm_version() -> str:
    out = subprocess.run([_which("slurmd"), "-V"], capture_output=True, text=True)
    return out.stdout.strip()  # "slurm-wlm 22.05.8" (Debian) or "slurm 23.11.4"


def write_slurm_conf(root: Path, node: str) -> Path:
    """The generated `slurm.conf` (one node, one partition `debug`, no accounting)."""
    user = getpass.getuser()
    host = node.split()[0].removeprefix("NodeName=")
    conf = f"""\
ClusterName=rpgtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
GresTypes=gpu
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
MinJobAge=300
KillWait={KILL_WAIT_S}
{node} Gres=gpu:1 NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    # One stand-in GPU (its device file is /dev/null): jobs can ask for `--gpus=1` and get
    # CUDA_VISIBLE_DEVICES, so a test sees the sweep's GPU request reach SLURM.
    (root / "gres.conf").write_text("Name=gpu File=/dev/null\n")
    path = root / "slurm.conf"
    path.write_text(conf)
    return path


def write_srun_shim(root: Path, conf: Path) -> Path:
    """A `bin/` whose `srun` sets SLURM_CONF, first on the jobs' PATH; returns the folder.

    Inside a job, the executor plugin starts the rule with `srun` after removing every
    SLURM_* variable but the job ids, SLURM_CONF included. A real cluster keeps its config
    at the default path (/etc/slurm/slurm.conf) and needs nothing; this cluster's config
    lives in a temp dir, so its `srun` is told where.
    """
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "srun"
    shim.write_text(f'#!/bin/sh\nSLURM_CONF="{conf}" exec "{_which("srun")}" "$@"\n')
    shim.chmod(0o755)
    return bin_dir


@dataclass
class SlurmCluster:
    """A running one-node cluster; `env` points SLURM clients (and Snakemake) at it."""

    root: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @classmethod
    def start(cls, root: Path, timeout_s: float = 60) -> SlurmCluster:
        root = Path(root)
        for sub in ("state", "spool"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        conf = write_slurm_conf(root, node_definition())
        env = {**os.environ, "SLURM_CONF": str(conf),
               "PATH": f"{write_srun_shim(root, conf)}{os.pathsep}{os.environ['PATH']}"}
        cluster = cls(root, env)
        try:
            cluster._spawn("munged", "--foreground", "--force", f"--socket={root}/munge.socket",
                           f"--key-file={key}", f"--pid-file={root}/munged.pid",
                           f"--seed-file={root}/munged.seed", f"--log-file={root}/munged.log")
            cluster._wait_for(lambda: (root / "munge.socket").exists(), "munged socket", timeout_s)
            cluster._spawn("slurmctld", "-D", "-i", "-f", str(conf))
            cluster._spawn("slurmd", "-D", "-f", str(conf))
            cluster._wait_for(cluster._node_idle, "the node to become idle", timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _spawn(self, name: str, *args: str) -> None:
        log = (self.root / f"{name}.out").open("w")
        self.procs[name] = subprocess.Popen([_which(name), *args], env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.root)

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-o", "%T", check=False).stdout.split()
        return "idle" in out

    def _wait_for(self, ready, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n"
                                       f"{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"SLURM test cluster: waited {timeout_s}s for {what}:\n{self.logs()}")

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM client command (squeue, scontrol, ...) against this cluster."""
        return subprocess.run([_which(cmd[0]), *cmd[1:]], env=self.env, capture_output=True,
                              text=True, check=check, timeout=60)

    def logs(self, tail: int = 30) -> str:
        parts = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            path = self.root / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel what is left in the queue (a job's slurmstepd outlives slurmd), then end
        the daemons by PID, node first; SIGKILL after 15 s."""
        if all(p.poll() is None for p in self.procs.values()) and "slurmd" in self.procs:
            self.run("scancel", "--user", getpass.getuser(), check=False)
            deadline = time.monotonic() + 2 * KILL_WAIT_S + 10
            while self.run("squeue", "-h", check=False).stdout.strip():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main(argv: list[str]) -> None:
    """`python tests/slurm/slurm_cluster.py DIR`: the same cluster for trying `--profile` by
    hand; prints the environment to use and runs until Ctrl-C."""
    if len(argv) != 1 or missing_programs():
        raise SystemExit(f"usage: slurm_cluster.py DIR (needs: apt-get install {PACKAGES}; "
                         f"missing: {', '.join(missing_programs()) or 'none'})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the daemons on kill too
    cluster = SlurmCluster.start(Path(argv[0]).resolve())
    print(f"{slurm_version()}: node idle, partition debug. In another shell:\n"
          f"  export SLURM_CONF={cluster.env['SLURM_CONF']} PATH={cluster.root / 'bin'}:$PATH",
          flush=True)
    try:
        while all(p.poll() is None for p in cluster.procs.values()):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
