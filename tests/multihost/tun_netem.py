"""tests/multihost/tun_netem.py — a userspace netem: delay and loss between test hosts through TUN devices.

Where the kernel has no sch_netem (`tc qdisc add ... netem` -> "unknown qdisc"), netns.py joins the
hosts through this forwarder instead (Hosts.netem falls back to it; stdlib only):

    python3 tun_netem.py forward --seed S NAME=ADDR ...   # one TUN device per host, made in the
                                                         # caller's namespace; prints "ready"
    python3 tun_netem.py ping ADDR COUNT INTERVAL_S       # ICMP echo (raw socket); one JSON line
    parse_spec("delay 20ms loss 1%")                      # (0.020, 0.01); ValueError otherwise

The forwarder opens /dev/net/tun once per NAME (IFF_TUN | IFF_NO_PI: one IPv4 packet per read),
prints "ready", and from then on moves packets: a packet read from any device goes to the device
whose ADDR is its destination IPv4 address, held for the delay of the source host's link plus the
destination's, and dropped with each end's loss probability (one seeded draw per lossy end). This
is the kernel netem layout of netns.Hosts.netem (netem on host i's eth0 and on its bridge port:
each direction of host i's link delayed and lossy). Packets that are not IPv4, or to no known
address, are counted and dropped. The caller (netns.py) moves each device into its host
(`ip link set NAME netns NS`, after "ready": the open descriptor stays attached) and routes the
impaired host's traffic through it; the devices vanish when the forwarder exits.

Commands on stdin, one a line:
    link ADDR DELAY_S LOSS   the link of the host at ADDR (LOSS 0..1; 1 is a cut link)
    stats                    prints {"forwarded": N, "dropped": N, "other": N} on stdout
EOF on stdin (the harness exited or closed it) ends the forwarder.
"""
import fcntl
import heapq
import json
import os
import random
import re
import select
import socket
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
MAX_PACKET = 65536


def parse_spec(spec):
    """'delay 20ms loss 1%' -> (delay seconds, loss fraction). Only delay and loss are emulated."""
    words, delay, loss, i = spec.split(), 0.0, 0.0, 0
    while i < len(words):
        key = words[i]
        if key not in ("delay", "loss") or i + 1 == len(words):
            raise ValueError(f"netem spec {spec!r}: {key!r} is not emulated without tc netem "
                             f"(the forwarder takes 'delay N[us|ms|s]' and 'loss P%')")
        value = words[i + 1]
        if key == "delay":
            m = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s)", value)
            if not m:
                raise ValueError(f"netem spec {spec!r}: delay {value!r} is not N us, ms or s (e.g. 20ms)")
            delay = float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
        else:
            m = re.fullmatch(r"(\d+(?:\.\d+)?)%", value)
            if not m or float(m.group(1)) > 100:
                raise ValueError(f"netem spec {spec!r}: loss {value!r} is not a percentage 0..100% (e.g. 1%)")
            loss = float(m.group(1)) / 100
        i += 2
    return delay, loss


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def forward(seed, devices):
    """devices: [(name, addr)]. Runs until stdin closes."""
    rng = random.Random(seed)
    fds = [open_tun(name) for name, _ in devices]
    by_addr = {socket.inet_aton(addr): k for k, (_, addr) in enumerate(devices)}
    links = [(0.0, 0.0)] * len(devices)  # (delay s, loss) of host k's link
    index = {fd: k for k, fd in enumerate(fds)}
    held, seq = [], 0  # heap of (due, seq, destination fd, packet)
    count = {"forwarded": 0, "dropped": 0, "other": 0}
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)
    pending = b""
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, fd, packet = heapq.heappop(held)
            try:
                os.write(fd, packet)
                count["forwarded"] += 1
            except OSError:  # the device went down (a host being deleted): as lost on the wire
                count["dropped"] += 1
        timeout = max(0.0, held[0][0] - now) if held else None
        ready, _, _ = select.select([stdin, *fds], [], [], timeout)
        for fd in ready:
            if fd == stdin:
                chunk = os.read(stdin, 4096)
                if not chunk:
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    words = line.decode().split()
                    if words[:1] == ["link"]:
                        links[by_addr[socket.inet_aton(words[1])]] = (float(words[2]), float(words[3]))
                    elif words[:1] == ["stats"]:
                        print(json.dumps(count), flush=True)
                continue
            src = index[fd]
            while True:
                try:
                    packet = os.read(fd, MAX_PACKET)
                except (BlockingIOError, OSError):
                    break
                dst = by_addr.get(packet[16:20]) if len(packet) >= 20 and packet[0] >> 4 == 4 else None
                if dst is None:
                    count["other"] += 1
                    continue
                (d1, l1), (d2, l2) = links[src], links[dst]
                if (l1 and rng.random() < l1) or (l2 and rng.random() < l2):
                    count["dropped"] += 1
                    continue
                seq += 1
                heapq.heappush(held, (time.monotonic() + d1 + d2, seq, fds[dst], packet))


def _checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def ping(addr, count, interval):
    """ICMP echo to addr, count requests interval seconds apart; waits 2 s for the last replies.
    {"sent": N, "received": N, "rtt_ms": [...]} (a raw socket: needs root)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    ident = os.getpid() & 0xFFFF
    sent_at, rtts = {}, []
    start = time.monotonic()
    seq = 0
    while True:
        now = time.monotonic()
        if seq < count and now >= start + seq * interval:
            body = struct.pack("!d", now) + b"dion-cpp" * 4
            header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
            packet = struct.pack("!BBHHH", 8, 0, _checksum(header + body), ident, seq) + body
            s.sendto(packet, (addr, 0))
            sent_at[seq] = now
            seq += 1
            continue
        end = start + (count - 1) * interval + 2.0
        if now >= end or (seq == count and len(rtts) == count):
            break
        wait = min(end, start + seq * interval) - now if seq < count else end - now
        ready, _, _ = select.select([s], [], [], max(0.0, wait))
        if ready:
            data, _ = s.recvfrom(MAX_PACKET)
            ihl = (data[0] & 0x0F) * 4
            kind, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
            if kind == 0 and rid == ident and rseq in sent_at:
                rtts.append((time.monotonic() - sent_at.pop(rseq)) * 1e3)
    return {"sent": count, "received": len(rtts), "rtt_ms": rtts}


def main(argv):
    if len(argv) >= 2 and argv[0] == "forward" and argv[1] == "--seed":
        forward(int(argv[2]), [tuple(a.split("=", 1)) for a in argv[3:]])
        return 0
    if len(argv) == 4 and argv[0] == "ping":
        print(json.dumps(ping(argv[1], int(argv[2]), float(argv[3]))))
        return 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
