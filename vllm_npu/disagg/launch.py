"""One command for disaggregated serving on one host: x prefill + y decode instances of
`vllm serve --device npu` joined by vLLM's MooncakeConnector, behind the router (proxy.py).

    python -m vllm_npu.disagg.launch MODEL --prefill 2 --prefill-tp 2 --decode 1 --port 8000 \\
        -- --max-model-len 4096 --dtype float32

Everything after `--` goes to every `vllm serve`. Each prefill instance gets its own
Mooncake bootstrap port; with `--host 127.0.0.1` (the default) every connection, the
transfer engine's included (`VLLM_HOST_IP`), stays on loopback. `PDCluster` is the same as a
context manager for scripts and tests.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests


_LOWEST = 10000  # ports below are often fixed ones of other services


def _die_with_parent() -> None:
    """In each instance (its own session, so kill() reaches its whole group): SIGTERM when
    the process that started it dies, so a launcher killed without its cleanup (SIGKILL, a
    test's timeout) leaves no instance behind. SIGTERM, not SIGKILL: vLLM's API server then
    shuts its engine and worker processes down (SIGKILLed, it died alone and they lived
    on). Linux prctl(PR_SET_PDEATHSIG); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_handed_out: set[int] = set()
_rng = random.Random()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a server that binds it later (an instance binds its ports
    tens of seconds after launch, once its model is loaded). Chosen below the kernel's
    ephemeral range: a port the kernel hands out itself (port 0, or the client side of
    every outgoing connection, the health checks included) can be taken by another
    process in between, which made an instance fail with "Address already in use".
    Never the same port twice from one process."""
    low = _ephemeral_range()[0]
    for _ in range(1000):
        port = _rng.randrange(_LOWEST, max(_LOWEST + 1, low))
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {host} in [{_LOWEST}, {low})")


def _launch(cmd: list[str], env: dict[str, str], log: Path, mode: str) -> subprocess.Popen:
    with open(log, mode) as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=_die_with_parent)


@dataclass
class Instance:
    role: str                   # "prefill" / "decode" / "proxy"
    url: str
    proc: subprocess.Popen
    log: Path
    bootstrap_port: int | None = None
    cmd: list[str] = field(default_factory=list)       # as started (restart() reuses them)
    env: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class PDCluster:
    model: str
    prefill_tp: tuple[int, ...] = (1,)  # one entry per prefill instance: its TP size
    decode_tp: tuple[int, ...] = (1,)   # one entry per decode instance
    host: str = "127.0.0.1"
    port: int = 0                       # the router's; 0 picks a free one
    serve_args: list[str] = field(default_factory=list)
    prefill_args: list[str] = field(default_factory=list)   # prefill instances only
    decode_args: list[str] = field(default_factory=list)    # decode instances only
    extra_config: dict = field(default_factory=dict)        # kv_connector_extra_config
    load_failure_policy: str = "fail"   # the decode side's kv_load_failure_policy
    env: dict[str, str] = field(default_factory=dict)  # set for every instance and the router
    router_args: list[str] = field(default_factory=list)  # e.g. --request-timeout-s 60
    # Per role ("prefill", "decode", "proxy"): another address than `host`, and a command
    # prefix (e.g. `ip netns exec NS`, to place instances on other simulated hosts).
    hosts: dict[str, str] = field(default_factory=dict)
    wrap: dict[str, list[str]] = field(default_factory=dict)
    log_dir: Path = Path("pd-logs")
    startup_s: float = 600.0
    instances: list[Instance] = field(default_factory=list)

    @property
    def prefills(self) -> list[Instance]:
        return [i for i in self.instances if i.role == "prefill"]

    @property
    def decodes(self) -> list[Instance]:
        return [i for i in self.instances if i.role == "decode"]

    @property
    def url(self) -> str:
        return self.router.url

    def _host(self, role: str) -> str:
        return self.hosts.get(role, self.host)

    def _port(self, role: str) -> int:
        # A wrapped role runs elsewhere (another namespace): its address is not ours to
        # bind, so the port is checked on our loopback.
        return free_port("127.0.0.1" if role in self.wrap else self._host(role))

    def _env(self, bootstrap_port: int | None, role: str = "") -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        env["VLLM_HOST_IP"] = self._host(role)
        env.update(self.env)
        if bootstrap_port is not None:
            env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(bootstrap_port)
        return env

    def _spawn(self, role: str, name: str, cmd: list[str], port: int,
               bootstrap_port: int | None = None) -> Instance:
        log = self.log_dir / f"{name}.log"
        cmd, env = [*self.wrap.get(role, []), *cmd], self._env(bootstrap_port, role)
        inst = Instance(role, f"http://{self._host(role)}:{port}", _launch(cmd, env, log, "w"),
                        log, bootstrap_port, cmd, env)
        self.instances.append(inst)
        return inst

    def restart(self, inst: Instance) -> None:
        """Kill the instance if it runs and start it again as before (same ports, same
        engine ids' bootstrap port; its log appended to); wait for its /health."""
        self.kill(inst)
        inst.proc = _launch(inst.cmd, inst.env, inst.log, "a")
        self.wait_healthy([inst])

    def _serve(self, role: str, index: int, tp: int, args: list[str]) -> Instance:
        port = self._port(role)
        producer = role == "prefill"
        kv = {"kv_connector": "MooncakeConnector",
              "kv_role": "kv_producer" if producer else "kv_consumer",
              "kv_connector_extra_config": self.extra_config}
        if not producer:
            kv["kv_load_failure_policy"] = self.load_failure_policy
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", self.model,
               "--device", "npu", "--host", self._host(role), "--port", str(port),
               "--tensor-parallel-size", str(tp), "--kv-transfer-config", json.dumps(kv),
               *self.serve_args, *args]
        return self._spawn(role, f"{role}{index}", cmd, port,
                           self._port(role) if producer else None)

    def start(self) -> PDCluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for i, tp in enumerate(self.prefill_tp):
                self._serve("prefill", i, tp, self.prefill_args)
            for i, tp in enumerate(self.decode_tp):
                self._serve("decode", i, tp, self.decode_args)
            self.wait_healthy(self.prefills + self.decodes)
            self.port = self.port or self._port("proxy")
            self.start_router()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def router(self) -> Instance:
        return next(i for i in reversed(self.instances) if i.role == "proxy")

    def router_cmd(self, port: int, args: list[str]) -> list[str]:
        """The command of a router over this deployment's instances."""
        cmd = [sys.executable, "-m", "vllm_npu.disagg.proxy", "--host", self._host("proxy"),
               "--port", str(port), *args]
        for p in self.prefills:
            cmd += ["--prefill", p.url, str(p.bootstrap_port)]
        for d in self.decodes:
            cmd += ["--decode", d.url]
        return cmd

    def start_router(self) -> Instance:
        """Start the router on `port` (again, after a restart: same port, same instances)."""
        cmd = self.router_cmd(self.port, self.router_args)
        earlier = sum(i.role == "proxy" for i in self.instances)
        router = self._spawn("proxy", f"proxy{earlier or ''}", cmd, self.port)
        self.wait_healthy([router])
        return router

    def wait_healthy(self, instances: list[Instance]) -> None:
        deadline = time.time() + self.startup_s
        for inst in instances:
            while True:
                if not inst.alive():
                    raise RuntimeError(f"{inst.log.stem} exited with {inst.proc.returncode}:"
                                       f"\n{inst.log.read_text()[-4000:]}")
                try:
                    if requests.get(f"{inst.url}/health", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"{inst.log.stem} not healthy after {self.startup_s}s:"
                                       f"\n{inst.log.read_text()[-4000:]}")
                time.sleep(1)

    def kill(self, inst: Instance) -> None:
        """SIGKILL the instance's whole process group (API server, engine, workers)."""
        if inst.alive():
            os.killpg(inst.proc.pid, signal.SIGKILL)
        inst.proc.wait()

    def stop(self) -> None:
        for inst in reversed(self.instances):
            if inst.alive():
                os.killpg(inst.proc.pid, signal.SIGTERM)
        for inst in self.instances:
            try:
                inst.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill(inst)

    def __enter__(self) -> PDCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    serve_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, serve_args = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prefill", type=int, default=1, help="prefill instances")
    ap.add_argument("--decode", type=int, default=1, help="decode instances")
    ap.add_argument("--prefill-tp", type=int, nargs="+", default=[1],
                    help="TP size of every prefill instance, or one per instance")
    ap.add_argument("--decode-tp", type=int, nargs="+", default=[1],
                    help="TP size of every decode instance, or one per instance")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="the router's port")
    ap.add_argument("--log-dir", type=Path, default=Path("pd-logs"))
    ap.add_argument("--kv-load-failure-policy", choices=("fail", "recompute"),
                    default="fail")
    ap.add_argument("--request-timeout-s", type=float, default=None,
                    help="the router's limit per request (504 past it); default: none")
    args = ap.parse_args(argv)
    tps = {}
    for role in ("prefill", "decode"):
        count, tp = getattr(args, role), getattr(args, f"{role}_tp")
        if count < 1 or min(tp) < 1:
            ap.error(f"--{role} and --{role}-tp must be >= 1")
        if len(tp) not in (1, count):
            ap.error(f"--{role}-tp takes one TP size or {count} (one per instance), "
                     f"got {len(tp)}")
        tps[role] = tuple(tp * count if len(tp) == 1 else tp)
    cluster = PDCluster(args.model, tps["prefill"], tps["decode"], args.host, args.port,
                        serve_args,
                        load_failure_policy=args.kv_load_failure_policy,
                        log_dir=args.log_dir,
                        router_args=[] if args.request_timeout_s is None else
                        ["--request-timeout-s", str(args.request_timeout_s)])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with cluster:
        print(f"{args.prefill}P{args.decode}D serving {args.model} at {cluster.url}/v1 "
              f"(logs in {args.log_dir}/); Ctrl-C stops it", flush=True)
        try:
            while all(i.alive() for i in cluster.instances):
                time.sleep(1)
            dead = [i.log.stem for i in cluster.instances if not i.alive()]
            sys.exit(f"stopped: {', '.join(dead)} exited (see {args.log_dir}/)")
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
