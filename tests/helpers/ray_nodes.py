"""Simulated hosts on this machine for the Ray tests: each a network namespace of its own (two
are joined by a veth pair whose addresses exist only inside the two namespaces; one alone has
loopback only), each with its own Ray temp dir (what ``ray start`` writes there stays per node)
and its own simulated NPUs; plus a runner for the README's shell lines and a small client.

They share the machine's memory, so the HCCL simulator's shared memory spans them, as one host's
would; reachability between them is real (the veth link), and the simulator checks it
(csrc/README.md, "Several hosts")."""
from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.server import FORK

VENV_BIN = os.path.dirname(sys.executable)
_SEQ = itertools.count()
REPO = str(Path(__file__).resolve().parents[2])


def netns_available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


@dataclass
class Node:
    netns: str
    ip: str
    ifname: str
    tmp: Path
    npus: int
    procs: list = field(default_factory=list)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD",
                            "RAY_ADDRESS", "ASCEND_RT_VISIBLE_DEVICES")}
        env.update({
            "PATH": f"{VENV_BIN}:{env.get('PATH', '')}", "PYTHONPATH": REPO,
            "RAY_TMPDIR": str(self.tmp), "TMPDIR": str(self.tmp),
            "NPU_SIM_DEVICE_COUNT": str(self.npus), "RAY_USAGE_STATS_ENABLED": "0",
            # the node's own interface, as docs/parallelism.md asks of every node
            "VLLM_HOST_IP": self.ip, "HCCL_IF_IP": self.ip, "GLOO_SOCKET_IFNAME": self.ifname,
            # the engine core forks from `vllm serve` (its Ray workers are actors either
            # way), as in the other served tests: tests/helpers/server.py says why
            **FORK,
        })
        env.update(extra or {})
        return env

    def run(self, cmd: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        """Run a shell line on this node and wait for it."""
        return subprocess.run(["ip", "netns", "exec", self.netns, "bash", "-c", cmd],
                              env=self.env(kw.pop("env", None)), capture_output=True,
                              text=True, timeout=timeout, **kw)

    def start(self, cmd: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a shell line on this node in the background, output to `log`."""
        with open(log, "w") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", self.netns, "bash", "-c", cmd],
                                    env=self.env(env), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        """Kill every process in this node's namespace (Ray's daemons detach from their
        starter, so process groups do not catch them; the namespace does)."""
        for _ in range(3):
            out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True,
                                 text=True).stdout.split()
            if not out:
                return
            for pid in out:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)


class Hosts:
    """Context manager: `count` hosts (node 1 = head), `npus` simulated NPUs each. Two hosts
    are joined by a veth pair; one host has loopback only (its address is 127.0.0.1)."""

    def __init__(self, count: int = 2, npus: int = 2):
        assert count in (1, 2)
        tag = f"{os.getpid() % 100000}{next(_SEQ)}"
        subnet = f"10.231.{os.getpid() % 200 + 20}"
        short = Path(f"/tmp/rn{tag}")  # Ray's unix socket paths must stay under 107 bytes
        if count == 1:
            self.nodes = [Node(f"npu-ray-{tag}-0", "127.0.0.1", "lo", short / "n0", npus)]
        else:
            self.nodes = [Node(f"npu-ray-{tag}-{i}", f"{subnet}.{i + 1}", f"vr{tag}{i}",
                               short / f"n{i}", npus) for i in range(count)]

    def __enter__(self) -> "Hosts":
        try:
            for node in self.nodes:
                _ip("netns", "add", node.netns)
                _ip("-n", node.netns, "link", "set", "lo", "up")
                node.tmp.mkdir(parents=True, exist_ok=True)
            if len(self.nodes) == 2:
                a, b = self.nodes
                _ip("link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname)
                for node in self.nodes:
                    _ip("link", "set", node.ifname, "netns", node.netns)
                    _ip("-n", node.netns, "addr", "add", f"{node.ip}/24", "dev", node.ifname)
                    _ip("-n", node.netns, "link", "set", node.ifname, "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for node in self.nodes:
            node.kill_all()
            for proc in node.procs:
                if proc.poll() is None:
                    proc.kill()
            subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
            shutil.rmtree(node.tmp.parent, ignore_errors=True)


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")


@dataclass
class Step:
    nodes: list[int]      # where it runs (1 = head)
    command: str
    capture: str | None   # a variable that takes the command's last output line


def readme_commands(marker: str) -> list[Step]:
    """The README's shell block after `<!-- marker ... -->`: continuation lines joined; the
    trailing comment `# node 1, node 2` says where a line runs (node 1 when absent) and
    `# node 1: NAME` that its output is NAME for the lines after it."""
    text = (Path(REPO) / "README.md").read_text()
    start = text.index(f"<!-- {marker}")
    block = text[text.index("```bash\n", start) + 8:]
    block = block[:block.index("```")]
    steps, pending = [], ""
    for raw in block.splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        nodes, capture = [1], None
        if "  #" in line:
            line, comment = (part.strip() for part in line.rsplit("  #", 1))
            where, _, capture = comment.partition(":")
            nodes = [int(w.split()[1]) for w in where.split(",")]
            capture = capture.strip() or None
        if line:
            steps.append(Step(nodes, line, capture))
    return steps


class Recipe:
    """Runs README steps on hosts: an export carries over to that node's later lines, a
    captured output becomes a variable of the later lines."""

    def __init__(self, nodes: list[Node], values: dict[str, str]):
        self.nodes = nodes
        self.values = dict(values)
        self.exports = {n: "" for n in range(1, len(nodes) + 1)}

    def run(self, step: Step) -> None:
        for n in step.nodes:
            if step.command.startswith("export "):
                self.exports[n] += step.command + "; "
                continue
            res = self.nodes[n - 1].run(self.exports[n] + step.command, env=self.values,
                                        timeout=180)
            if res.returncode != 0:
                raise RuntimeError(f"node {n}: `{step.command}` exited {res.returncode}:\n"
                                   f"{res.stderr[-3000:]}")
            if step.capture:
                self.values[step.capture] = res.stdout.strip().splitlines()[-1]

    def start(self, step: Step, args: str, log: Path,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a long-running step (``vllm serve``) on its node with `args` appended."""
        n = step.nodes[0]
        return self.nodes[n - 1].start(f"{self.exports[n]}{step.command} {args}", log,
                                       env={**self.values, **(env or {})})


def wait_healthy(node: Node, port: int, server: subprocess.Popen, log: Path,
                 timeout: float = 400) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited {server.returncode}:\n"
                               f"{log.read_text()[-4000:]}")
        if client(node, port, "health", "5", timeout=60).returncode == 0:
            return
    raise RuntimeError(f"vllm serve not healthy after {timeout} s:\n{log.read_text()[-4000:]}")


CLIENT = r'''
import json, sys, time, requests
base, cmd = sys.argv[1], sys.argv[2]
if cmd == "health":
    deadline = time.time() + float(sys.argv[3])
    while time.time() < deadline:
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                print("ok"); sys.exit(0)
        except requests.RequestException:
            pass
        time.sleep(1)
    print("timeout"); sys.exit(1)
req = json.loads(sys.argv[3])
if cmd == "complete":
    from tests.helpers.server import complete  # the served tests' client, inside the node
    print(json.dumps([complete(base, p, req["max_tokens"]) for p in req["prompts"]]))
elif cmd == "stream":
    chunks, error = 0, None
    try:
        with requests.post(base + "/v1/completions", timeout=req["timeout"], stream=True,
                           json={"model": "tiny", "prompt": req["prompt"], "stream": True,
                                 "max_tokens": req["max_tokens"], "temperature": 0,
                                 "ignore_eos": True}) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                text = line.decode()
                if '"error"' in text:
                    error = text[:500]
                    break
                if text.startswith("data: {"):
                    chunks += 1
                    if chunks == req["signal_after"]:
                        open(req["signal_file"], "w").close()
    except requests.RequestException as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    print(json.dumps({"chunks": chunks, "error": error}))
'''


def client(node: Node, port: int, cmd: str, arg: str, timeout: float = 400):
    """Run CLIENT on `node` (its namespace) against the server on `node`'s address."""
    return node.run(" ".join(shlex.quote(a) for a in (
        sys.executable, "-c", CLIENT, f"http://{node.ip}:{port}", cmd, arg)), timeout=timeout)


def actors_on(node: Node, name: str) -> int:
    """How many of Ray's worker processes on `node` run actor class `name` (their process
    title is `ray::<class>`)."""
    pids = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True,
                          text=True).stdout.split()
    count = 0
    for pid in pids:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        count += title.startswith(f"ray::{name}")
    return count


def complete_on(node: Node, prompts: list[list[int]], max_tokens: int,
                port: int = 8000) -> list[list[int]]:
    """Greedy completions of `prompts` from the server on `node`, as token ids."""
    res = client(node, port, "complete", json.dumps({"prompts": prompts,
                                                      "max_tokens": max_tokens}))
    if res.returncode != 0:
        raise RuntimeError(f"completions failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])
