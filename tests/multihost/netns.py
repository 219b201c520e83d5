"""tests/multihost/netns.py — test "hosts" as Linux network namespaces on a private bridge.

    from netns import Hosts, unavailable
    reason = unavailable()            # None, or why namespaces cannot be made here (skip with it)
    with Hosts(2) as hosts:           # namespaces <tag>-h0, <tag>-h1 and a switch <tag>-sw
        hosts.addr(0)                 # '10.23.0.1' (host i is 10.23.0.<i+1>/24)
        p = hosts.popen(0, [...])     # a process inside host 0 (subprocess.Popen keywords pass on)
        hosts.run(1, [...])           # ... run to completion (subprocess.run)
        hosts.netem(1, "delay 20ms loss 1%")  # netem on both ends of host 1's link (each direction)
        hosts.clear_netem(1)
        hosts.cut(1); hosts.restore(1)        # host 1's link down / up (a blackhole: no RST, no ICMP)
        hosts.kill_host(1)                    # SIGKILL every process inside host 1
    # leaving the block (a failure included) kills every process still inside the namespaces,
    # then deletes them, their links with them; an atexit hook does the same if the block is skipped.

Layout: the bridge lives in its own namespace (<tag>-sw), so nothing touches the machine's own
network; each host's eth0 is one end of a veth pair whose other end (h<i>) is a bridge port.
Every Hosts() takes a fresh random tag, so parallel test runs cannot collide; addresses repeat
across Hosts() objects, which is fine: each set has its own bridge.

Also a command line for scripts (scripts/soak_multihost_restart.sh) and by hand:
    python3 tests/multihost/netns.py check     # exit 0 when namespaces work, else prints why, 1
"""
import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

SUBNET = "10.23.0"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def unavailable():
    """None when network namespaces can be created here, else the reason (for a skip)."""
    if shutil.which("ip") is None:
        return "network namespaces unavailable: no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces unavailable: not root (ip netns add needs CAP_SYS_ADMIN)"
    name = "dionprobe-" + secrets.token_hex(4)
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return "network namespaces unavailable: ip netns add failed: " + r.stderr.strip()
    _ip("netns", "del", name, check=False)
    return None


def netem_unavailable():
    """None when tc netem works inside a namespace, else the reason."""
    if shutil.which("tc") is None:
        return "no `tc` command (iproute2)"
    with Hosts(1) as h:
        r = h.run(0, ["tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms"], capture_output=True,
                  text=True)
        return None if r.returncode == 0 else "tc netem failed: " + r.stderr.strip()


class Hosts:
    def __init__(self, n, tag=None):
        self.n = n
        self.tag = tag or "dmh" + secrets.token_hex(3)  # 9 characters: veth names stay under 15
        self.sw = self.tag + "-sw"
        self.names = [f"{self.tag}-h{i}" for i in range(n)]
        self._procs = []
        self._made = []
        atexit.register(self.close)
        try:
            self._create()
        except Exception:
            self.close()
            raise

    # ------------------------------------------------------------------ setup / teardown
    def _create(self):
        _ip("netns", "add", self.sw)
        self._made.append(self.sw)
        self._sw("ip", "link", "add", "br0", "type", "bridge")
        self._sw("ip", "link", "set", "br0", "up")
        self._sw("ip", "link", "set", "lo", "up")
        for i, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            self._made.append(ns)
            a, b = f"{self.tag}a{i}", f"{self.tag}b{i}"
            _ip("link", "add", a, "type", "veth", "peer", "name", b)
            _ip("link", "set", a, "netns", ns)
            _ip("link", "set", b, "netns", self.sw)
            self._in(ns, "ip", "link", "set", a, "name", "eth0")
            self._in(ns, "ip", "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            self._in(ns, "ip", "link", "set", "eth0", "up")
            self._in(ns, "ip", "link", "set", "lo", "up")
            self._sw("ip", "link", "set", b, "name", f"h{i}")
            self._sw("ip", "link", "set", f"h{i}", "master", "br0")
            self._sw("ip", "link", "set", f"h{i}", "up")

    def close(self):
        """Kills every process inside the namespaces (SIGKILL), then deletes them. Idempotent."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in self._made:
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:  # processes still inside (a launcher's orphans): started by this harness
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made = []
        self._procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ helpers
    def addr(self, i):
        return f"{SUBNET}.{i + 1}"

    def _in(self, ns, *cmd):
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True)

    def _sw(self, *cmd):
        return self._in(self.sw, *cmd)

    def popen(self, i, cmd, **kw):
        """Starts cmd inside host i (its own process group, killed at close)."""
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(["ip", "netns", "exec", self.names[i], *cmd], **kw)
        self._procs.append(p)
        return p

    def run(self, i, cmd, **kw):
        return subprocess.run(["ip", "netns", "exec", self.names[i], *cmd], **kw)

    def netem(self, i, spec):
        """netem `spec` (e.g. 'delay 20ms loss 1%') on host i's eth0 and on its bridge port: each direction."""
        self.clear_netem(i)
        self._in(self.names[i], "tc", "qdisc", "add", "dev", "eth0", "root", "netem", *spec.split())
        self._sw("tc", "qdisc", "add", "dev", f"h{i}", "root", "netem", *spec.split())

    def clear_netem(self, i):
        subprocess.run(["ip", "netns", "exec", self.names[i], "tc", "qdisc", "del", "dev", "eth0", "root"],
                       capture_output=True)
        subprocess.run(["ip", "netns", "exec", self.sw, "tc", "qdisc", "del", "dev", f"h{i}", "root"],
                       capture_output=True)

    def cut(self, i):
        """Host i's link goes silent: its bridge port down (packets vanish; TCP sees no reset)."""
        self._sw("ip", "link", "set", f"h{i}", "down")

    def kill_host(self, i):
        """SIGKILL every process inside host i (a host that dies: its kernel resets its sockets)."""
        for pid in _ip("netns", "pids", self.names[i], check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def restore(self, i):
        self._sw("ip", "link", "set", f"h{i}", "up")
        # the port goes through the bridge's listening/learning states only with STP on (off here)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "check":
        why = unavailable()
        print(why or "network namespaces available")
        sys.exit(1 if why else 0)
    sys.exit(__doc__)
