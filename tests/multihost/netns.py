"""tests/multihost/netns.py — test "hosts" as Linux network namespaces on a private bridge.

    from netns import Hosts, unavailable
    reason = unavailable()            # None, or why namespaces cannot be made here (skip with it)
    with Hosts(2) as hosts:           # namespaces <tag>-h0, <tag>-h1 and a switch <tag>-sw
        hosts.addr(0)                 # '10.23.0.1' (host i is 10.23.0.<i+1>/24)
        p = hosts.popen(0, [...])     # a process inside host 0 (subprocess.Popen keywords pass on)
        hosts.run(1, [...])           # ... run to completion (subprocess.run)
        hosts.netem(1, "delay 20ms loss 1%")  # each direction of host 1's link: 'tc netem' or 'tun forwarder'
        hosts.clear_netem(1)                  # (the kernel's sch_netem where it exists, else tun_netem.py)
        hosts.forwarder_stats()               # {"forwarded", "dropped", "other"} packets (tun forwarder)
        hosts.cut(1); hosts.restore(1)        # host 1's link down / up (a blackhole: no RST, no ICMP)
        hosts.kill_host(1)                    # SIGKILL every process inside host 1 (hosts.pids(1): them)
    # leaving the block (a failure included) kills every process still inside the namespaces,
    # then deletes them, their links with them; an atexit hook does the same if the block is skipped.

Layout: the bridge lives in its own namespace (<tag>-sw), so nothing touches the machine's own
network; each host's eth0 is one end of a veth pair whose other end (h<i>) is a bridge port.
Every Hosts() takes a fresh random tag, so parallel test runs cannot collide; addresses repeat
across Hosts() objects, which is fine: each set has its own bridge.

netem without the kernel's sch_netem (netem(i, spec, via="tun"), the fallback): a forwarder
(tun_netem.py, a process of the harness in the caller's namespace) opens one TUN device per host
and the harness moves each into its host as tun0 (MTU 64000, like veth's 64 KB GSO packets, so
that the forwarder copies few packets); /32 routes send host i's traffic to and from every other
host through tun0 instead of eth0 (same addresses: Gloo's sockets stay bound to eth0's), and the
forwarder holds each packet for the delay and drops the loss fraction (seeded) at host i's end of
each direction: real IP-level loss, TCP retransmits. cut(i) then also drops everything on host
i's tun path. The routes go when the netem is cleared; the devices when the forwarder exits.

Also a command line for scripts (scripts/soak_multihost_restart.sh) and by hand:
    python3 tests/multihost/netns.py check     # exit 0 when namespaces work, else prints why, 1
"""
import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tun_netem  # noqa: E402

SUBNET = "10.23.0"
TUN_MTU = 64000
FORWARDER_SEED = 23


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


_probed = {}


def kernel_netem_unavailable():
    """None when tc netem works inside a namespace, else the reason (probed once per process)."""
    if "tc" not in _probed:
        if shutil.which("tc") is None:
            _probed["tc"] = "no `tc` command (iproute2)"
        else:
            name = "dionprobe-" + secrets.token_hex(4)
            _ip("netns", "add", name)
            try:
                r = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                    "delay", "1ms"], capture_output=True, text=True)
                _probed["tc"] = None if r.returncode == 0 else "tc netem failed: " + r.stderr.strip()
            finally:
                _ip("netns", "del", name, check=False)
    return _probed["tc"]


def tun_unavailable():
    """None when a TUN device can be made here (the userspace netem, tun_netem.py), else the reason."""
    if "tun" not in _probed:
        try:
            os.close(tun_netem.open_tun("dionprobe" + secrets.token_hex(3)))
            _probed["tun"] = None
        except OSError as e:
            _probed["tun"] = f"/dev/net/tun: {e.strerror}"
    return _probed["tun"]


def netem_unavailable():
    """None when delay and loss can be put on a link here (tc netem or the TUN forwarder), else why."""
    tc, tun = kernel_netem_unavailable(), tun_unavailable()
    return None if tc is None or tun is None else f"{tc}; no TUN forwarder either ({tun})"


class Hosts:
    def __init__(self, n, tag=None):
        self.n = n
        self.tag = tag or "dmh" + secrets.token_hex(3)  # 9 characters: veth names stay under 15
        self.sw = self.tag + "-sw"
        self.names = [f"{self.tag}-h{i}" for i in range(n)]
        self._procs = []
        self._made = []
        self._fwd = None  # the TUN forwarder (tun_netem.py), started by the first netem(via="tun")
        self._tun_links = {}  # host -> (delay s, loss) of the links routed through the forwarder
        self._cut = set()
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
        if self._fwd is not None:  # EOF on its stdin ends it; its devices go with it
            try:
                self._fwd.stdin.close()
                self._fwd.wait(timeout=10)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self._fwd.kill()
                self._fwd.wait()
            self._fwd = None
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

    def netem(self, i, spec, via=None):
        """Delay/loss `spec` (e.g. 'delay 20ms loss 1%') on each direction of host i's link. via: 'tc'
        (netem on host i's eth0 and on its bridge port), 'tun' (the forwarder: 'delay' and 'loss'
        only), None: tc where the kernel has sch_netem, else tun. Returns which ran: 'tc netem' or
        'tun forwarder'."""
        if via is None:
            via = "tc" if kernel_netem_unavailable() is None else "tun"
        if via not in ("tc", "tun"):
            raise ValueError(f"netem via {via!r}: 'tc', 'tun' or None")
        delay, loss = tun_netem.parse_spec(spec) if via == "tun" else (None, None)  # before any change
        self.clear_netem(i)
        if via == "tc":
            self._in(self.names[i], "tc", "qdisc", "add", "dev", "eth0", "root", "netem", *spec.split())
            self._sw("tc", "qdisc", "add", "dev", f"h{i}", "root", "netem", *spec.split())
            return "tc netem"
        self._start_forwarder()
        for j in range(self.n):
            if j != i:
                self._in(self.names[i], "ip", "route", "replace", f"{self.addr(j)}/32", "dev", "tun0", "src",
                         self.addr(i))
                self._in(self.names[j], "ip", "route", "replace", f"{self.addr(i)}/32", "dev", "tun0", "src",
                         self.addr(j))
        self._tun_links[i] = (delay, loss)
        self._tell_forwarder(i)
        return "tun forwarder"

    def clear_netem(self, i):
        subprocess.run(["ip", "netns", "exec", self.names[i], "tc", "qdisc", "del", "dev", "eth0", "root"],
                       capture_output=True)
        subprocess.run(["ip", "netns", "exec", self.sw, "tc", "qdisc", "del", "dev", f"h{i}", "root"],
                       capture_output=True)
        if i in self._tun_links:
            del self._tun_links[i]
            self._tell_forwarder(i)
            for j in range(self.n):
                if j != i and j not in self._tun_links:  # a pair with another impaired host stays on tun0
                    self._in(self.names[i], "ip", "route", "del", f"{self.addr(j)}/32", "dev", "tun0")
                    self._in(self.names[j], "ip", "route", "del", f"{self.addr(i)}/32", "dev", "tun0")

    def forwarder_stats(self):
        """The TUN forwarder's packet counts so far: {"forwarded", "dropped", "other"} (None: not started)."""
        if self._fwd is None:
            return None
        self._fwd.stdin.write("stats\n")
        self._fwd.stdin.flush()
        return json.loads(self._fwd.stdout.readline())

    def _start_forwarder(self):
        if self._fwd is not None:
            return
        devs = [f"{self.tag}t{k}" for k in range(self.n)]
        self._fwd = subprocess.Popen(
            [sys.executable, tun_netem.__file__, "forward", "--seed", str(FORWARDER_SEED),
             *(f"{d}={self.addr(k)}" for k, d in enumerate(devs))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._fwd.stdout.readline()
        if line.strip() != "ready":
            self._fwd.kill()
            raise RuntimeError(f"the TUN forwarder (tun_netem.py) did not start: {line!r}, exit {self._fwd.wait()}")
        for k, d in enumerate(devs):
            _ip("link", "set", d, "netns", self.names[k])
            self._in(self.names[k], "ip", "link", "set", d, "name", "tun0")
            subprocess.run(["ip", "netns", "exec", self.names[k], "sysctl", "-qw", "net.ipv6.conf.tun0.disable_ipv6=1"],
                           capture_output=True)  # no router solicitations; absent without IPv6
            self._in(self.names[k], "ip", "link", "set", "tun0", "mtu", str(TUN_MTU), "up")

    def _tell_forwarder(self, i):
        delay, loss = self._tun_links.get(i, (0.0, 0.0))
        if i in self._cut:
            loss = 1.0
        self._fwd.stdin.write(f"link {self.addr(i)} {delay} {loss}\n")
        self._fwd.stdin.flush()

    def cut(self, i):
        """Host i's link goes silent: its bridge port down (packets vanish; TCP sees no reset), and its
        TUN path, if any, drops everything."""
        self._sw("ip", "link", "set", f"h{i}", "down")
        self._cut.add(i)
        if self._fwd is not None:
            self._tell_forwarder(i)

    def pids(self, i):
        """The processes inside host i now."""
        return [int(p) for p in _ip("netns", "pids", self.names[i], check=False).stdout.split()]

    def kill_host(self, i, pids=None):
        """SIGKILL every process inside host i (a host that dies: its kernel resets its sockets); `pids`
        (from pids(i), taken earlier) kills without listing them first, within microseconds."""
        for pid in self.pids(i) if pids is None else pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def restore(self, i):
        self._sw("ip", "link", "set", f"h{i}", "up")
        # the port goes through the bridge's listening/learning states only with STP on (off here)
        self._cut.discard(i)
        if self._fwd is not None:
            self._tell_forwarder(i)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "check":
        why = unavailable()
        print(why or "network namespaces available")
        sys.exit(1 if why else 0)
    sys.exit(__doc__)
