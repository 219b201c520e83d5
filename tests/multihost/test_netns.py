"""tests/multihost/test_netns.py — the harness itself: netem on a link, by the kernel or the TUN forwarder.

ctest -L multihost (part of multihost_tests). ICMP echo (tun_netem.py ping: a raw socket, this
image has no ping) from host 0 to host 1 with 'delay 20ms loss 1%' on host 1's link:
- the TUN forwarder (tun_netem.py, the fallback where the kernel has no sch_netem): every reply
  takes at least 2 x 20 ms (each direction is held; the bridge's RTT is well under 1 ms, so a
  packet that bypassed the forwarder fails this), the round-trip loss is about 1 - 0.99^2 = 2%
  and the forwarder's own count of dropped packets about 1% (seeded; bounds 4+ sigma wide); a
  cut link loses every echo, a restored one answers again; cleared, the pings no longer pass
  through the forwarder (its count stays) and host 0 has no tun0 route left; leaving the block
  ends the forwarder and leaves no device behind.
- tc netem, where the kernel has it: the same RTT floor (skips "tc netem unavailable" elsewhere).
- the spec parser takes delay and loss and names anything else.
"""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402
import tun_netem  # noqa: E402

DELAY_MS, LOSS = 20, 0.01
PINGS = 1000

_why = netns.unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


def ping(hosts, src, dst, count, interval=0.005):
    r = hosts.run(src, [sys.executable, tun_netem.__file__, "ping", hosts.addr(dst), str(count), str(interval)],
                  capture_output=True, text=True, timeout=count * interval + 30)
    assert r.returncode == 0, r.stdout + r.stderr
    j = json.loads(r.stdout)
    return j["received"], sorted(j["rtt_ms"])


def tun_routes(hosts, i):
    out = hosts.run(i, ["ip", "route"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "tun0" in line]


def test_tun_forwarder_delay_and_loss():
    why = netns.tun_unavailable()
    if why:
        pytest.skip("tun netem unavailable: " + why)
    with netns.Hosts(2) as hosts:
        got, _ = ping(hosts, 0, 1, 20)
        assert got == 20, f"the bridge lost {20 - got} of 20 echoes"
        assert hosts.netem(1, f"delay {DELAY_MS}ms loss {LOSS:.0%}", via="tun") == "tun forwarder"
        fwd = hosts._fwd
        got, rtt = ping(hosts, 0, 1, PINGS)
        stats = hosts.forwarder_stats()
        lost = PINGS - got
        print(f"tun forwarder, delay {DELAY_MS} ms + loss {LOSS:.0%} on host 1's link: RTT min {rtt[0]:.1f} ms, "
              f"median {rtt[len(rtt) // 2]:.1f} ms; {lost} of {PINGS} echoes lost; forwarder {stats}")
        assert rtt[0] >= 2 * DELAY_MS, f"an echo came back in {rtt[0]:.2f} ms: not held {DELAY_MS} ms each way"
        median = rtt[len(rtt) // 2]
        assert median < 2 * DELAY_MS + 500, f"median RTT {median:.0f} ms: delay in the wrong unit?"
        expect = PINGS * (1 - (1 - LOSS) ** 2)  # 19.9, sigma 4.4
        assert expect - 15 <= lost <= expect + 25, f"{lost} of {PINGS} echoes lost, expected about {expect:.0f}"
        seen = stats["forwarded"] + stats["dropped"]
        assert seen >= 2 * PINGS - 2 * lost - 5, stats
        assert abs(stats["dropped"] / seen - LOSS) <= 0.009, f"dropped {stats['dropped']} of {seen} packets"

        hosts.cut(1)
        got, _ = ping(hosts, 0, 1, 20)
        assert got == 0, f"{got} of 20 echoes crossed a cut link"
        hosts.restore(1)
        got, rtt = ping(hosts, 0, 1, 20)
        assert got >= 15 and rtt[0] >= 2 * DELAY_MS, (got, rtt)

        hosts.clear_netem(1)
        before = hosts.forwarder_stats()
        got, _ = ping(hosts, 0, 1, 20)
        assert got == 20, f"{20 - got} of 20 echoes lost after clear_netem"
        after = hosts.forwarder_stats()
        assert after["forwarded"] == before["forwarded"], "cleared, the pings still pass the forwarder"
        assert tun_routes(hosts, 0) == [] and tun_routes(hosts, 1) == [], (tun_routes(hosts, 0), tun_routes(hosts, 1))
        tag = hosts.tag
    assert fwd.poll() is not None, "the forwarder outlived its hosts"
    left = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert tag not in left, left


def test_kernel_netem_delay():
    why = netns.kernel_netem_unavailable()
    if why:
        pytest.skip("tc netem unavailable: " + why)
    with netns.Hosts(2) as hosts:
        assert hosts.netem(1, f"delay {DELAY_MS}ms", via="tc") == "tc netem"
        got, rtt = ping(hosts, 0, 1, 50)
        assert got == 50 and rtt[0] >= 2 * DELAY_MS, (got, rtt[:3])


def test_netem_spec():
    assert tun_netem.parse_spec("delay 20ms loss 1%") == (0.020, 0.01)
    assert tun_netem.parse_spec("loss 0.5%") == (0.0, 0.005)
    assert tun_netem.parse_spec("delay 1s") == (1.0, 0.0)
    for spec, want in [("delay 20ms rate 1mbit", "'rate' is not emulated"), ("delay 20", "delay '20' is not"),
                       ("loss 120%", "loss '120%' is not"), ("delay", "'delay' is not emulated")]:
        with pytest.raises(ValueError, match=want):
            tun_netem.parse_spec(spec)
