#!/usr/bin/env python3
"""A Ray cluster of three nodes on one machine, for tests: a head and two
workers, each in its own network namespace with its own address on a
bridge, so that Ray sees three machines. Needs root (network namespaces)
and iproute2; all traffic stays inside the namespaces.

    cluster.py up        # namespaces, bridge, head (10.77.0.10), w1 (.11), w2 (.12)
    cluster.py kill w2   # SIGKILL every process of node w2 (raylet, replicas)
    cluster.py start w2  # start node w2 again
    cluster.py status    # the nodes the head counts alive
    cluster.py down      # stop everything, remove the namespaces

A fourth namespace, sp-client (10.77.0.20), runs no Ray: clients run there
(`ip netns exec sp-client ...`) and reach the head over the bridge as
another machine would. The root namespace has no address on the bridge.

Ray comes from the virtualenv of RAY_PYTHON (default: target/ray-venv);
its nodes run with that environment (and SPINDLE_PYTHONPATH, when set, as
their PYTHONPATH), so replicas import `spindle` from it. Each worker offers
SPINDLE_RAY_WORKER_CPUS CPUs to Ray (default 1); the head offers none, so
replicas land on the workers. Every wait is bounded; `up` tears down what
it started when a node does not join.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get("RAY_PYTHON", ROOT / "target/ray-venv/bin/python"))
BIN = PYTHON.parent
PREFIX = "sp"  # namespaces sp-head, sp-w1, sp-w2, sp-net (the bridge's)
SUBNET = "10.77.0"
NODES = {"head": 10, "w1": 11, "w2": 12}
CLIENT = ("client", 20)  # a namespace on the bridge without Ray
GCS_PORT = 6379
SERVE_PORT = 8000
TEMP_DIR = "/tmp/ray-spindle"
# CPUs Ray may give replicas on each worker (the head runs the ingress
# and Serve's own actors only).
WORKER_CPUS = int(os.environ.get("SPINDLE_RAY_WORKER_CPUS", "1"))
LOGS = ROOT / "target/ray-cluster"


def sh(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, **kw)


def ns(node):
    return f"{PREFIX}-{node}"


def address(node):
    if node == CLIENT[0]:
        return f"{SUBNET}.{CLIENT[1]}"
    return f"{SUBNET}.{NODES[node]}"


def head_address():
    return f"{address('head')}:{GCS_PORT}"


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def node_env():
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Inside the namespaces only; the cluster is a test fixture.
    env["RAY_AUTH_MODE"] = "disabled"
    # A lost node is noticed in seconds, not the default half minute.
    env["RAY_health_check_period_ms"] = "1000"
    env["RAY_health_check_failure_threshold"] = "3"
    if os.environ.get("SPINDLE_PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["SPINDLE_PYTHONPATH"]
    return env


def network_up():
    have = namespaces()
    net = ns("net")
    if net not in have:
        sh("ip", "netns", "add", net)
    sh("ip", "-n", net, "link", "set", "lo", "up")
    if sh("ip", "-n", net, "link", "show", "br0", check=False, capture_output=True).returncode != 0:
        sh("ip", "-n", net, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", net, "link", "set", "br0", "up")
    for node in [*NODES, CLIENT[0]]:
        name = ns(node)
        if name not in have:
            sh("ip", "netns", "add", name)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        if sh("ip", "-n", name, "link", "show", "eth0", check=False, capture_output=True).returncode == 0:
            continue
        # One end in the node as eth0, the other on the bridge.
        outer = f"{PREFIX}-{node}-br"
        sh("ip", "link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", outer, "netns", net)
        sh("ip", "-n", name, "addr", "add", f"{address(node)}/24", "dev", "eth0")
        sh("ip", "-n", name, "link", "set", "eth0", "up")
        sh("ip", "-n", net, "link", "set", outer, "master", "br0")
        sh("ip", "-n", net, "link", "set", outer, "up")


def start_node(node):
    """Starts the node's Ray processes in its namespace, in the background."""
    LOGS.mkdir(parents=True, exist_ok=True)
    args = [
        "ip", "netns", "exec", ns(node), str(BIN / "ray"), "start", "--block",
        f"--node-ip-address={address(node)}", "--disable-usage-stats",
        # A temporary directory per node: one shared by the three would have
        # each node's log monitor forward every node's logs.
        "--object-store-memory=100000000", f"--temp-dir={TEMP_DIR}/{node}",
    ]
    if node == "head":
        args += ["--head", f"--port={GCS_PORT}", "--num-cpus=0", "--include-dashboard=false"]
    else:
        args += [f"--address={head_address()}", f"--num-cpus={WORKER_CPUS}"]
    with open(LOGS / f"{node}.log", "ab") as log:
        subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env=node_env(), start_new_session=True)


def in_namespace(node, *cmd, timeout=60, **kw):
    """Runs a command inside `node`'s namespace with the cluster's env."""
    return subprocess.run(["ip", "netns", "exec", ns(node), *cmd], env=node_env(), timeout=timeout, **kw)


def alive_nodes():
    """Addresses of the nodes the head counts alive ([] while it is down)."""
    code = (
        "import ray, json\n"
        f"ray.init(address='{head_address()}', logging_level='ERROR')\n"
        "print(json.dumps([n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']]))\n"
    )
    try:
        out = in_namespace("head", str(PYTHON), "-c", code, timeout=60, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return []
    if out.returncode != 0 or not out.stdout.strip():
        return []
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except ValueError:
        return []


def wait_for_nodes(want, deadline_s=180):
    """Waits (at most deadline_s) until every node of `want` is alive."""
    end = time.time() + deadline_s
    while time.time() < end:
        alive = alive_nodes()
        if all(address(n) in alive for n in want):
            return alive
        time.sleep(2)
    raise RuntimeError(f"nodes {want} did not join within {deadline_s} s (logs in {LOGS})")


def kill_node(node):
    """SIGKILL to every process in the node's namespace: its raylet, object
    store, workers and replicas go at once, as when a machine dies."""
    pids = subprocess.run(["ip", "netns", "pids", ns(node)], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    return len(pids)


def up():
    if not PYTHON.exists():
        raise SystemExit(f"{PYTHON} is missing: python3 -m venv target/ray-venv && target/ray-venv/bin/pip install 'ray[serve]' maturin openai")
    if os.geteuid() != 0:
        raise SystemExit("network namespaces need root")
    network_up()
    try:
        start_node("head")
        wait_for_nodes(["head"])
        # One at a time: two nodes registering at once on 2 cores can miss
        # Ray's 30 s start-up deadline.
        for node in ("w1", "w2"):
            start_node(node)
            wait_for_nodes([node])
        alive = wait_for_nodes(list(NODES))
    except BaseException:
        down()
        raise
    print(f"cluster up: {', '.join(alive)} (head {head_address()})")


def down():
    # Until no process is left in the namespaces (a process may fork while
    # a pass kills), at most 20 passes.
    for _ in range(20):
        left = sum(kill_node(node) for node in [*NODES, CLIENT[0]] if ns(node) in namespaces())
        if left == 0:
            break
        time.sleep(0.5)
    else:
        print(f"warning: processes are left in the namespaces: ip netns pids {PREFIX}-...", file=sys.stderr)
    for name in sorted(namespaces()):
        if name.startswith(f"{PREFIX}-"):
            sh("ip", "netns", "del", name, check=False)
    shutil.rmtree(TEMP_DIR, ignore_errors=True)
    print("cluster down")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["up", "down", "kill", "start", "status"])
    p.add_argument("node", nargs="?", choices=list(NODES))
    a = p.parse_args()
    if a.action == "up":
        up()
    elif a.action == "down":
        down()
    elif a.action == "status":
        print(json.dumps(alive_nodes()))
    elif a.action == "kill":
        print(f"killed {kill_node(a.node or 'w2')} processes of {a.node or 'w2'}")
    elif a.action == "start":
        start_node(a.node or "w2")
        wait_for_nodes([a.node or "w2"])
        print(f"{a.node or 'w2'} is back")


if __name__ == "__main__":
    sys.exit(main())
