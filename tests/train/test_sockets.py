"""Who can reach the sockets a run opens (issue 45 item 2; docs/reliability.md, "Sockets"): a
one-process run listens on no address another host can reach. torch's TCPStore listened on every
interface (MASTER_ADDR notwithstanding): from another host its keys were read and written and
megabytes stored in the trainer."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

from trainlib import ROOT, cli_env, tiny_recipe


# a one-step run in a process of its own (a fresh process group); the sockets it listens on are
# read while the group is still up (when the run tears it down)
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import rltune.engine.distributed as d

    def listening():
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        out = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:
                    out.append(f[1])
        return out

    seen = {"before": listening()}
    shutdown = d.shutdown_distributed

    def spy(clean=True):
        seen["during"] = listening()
        return shutdown(clean)

    d.shutdown_distributed = spy
    from rltune.cli import main
    try:
        main(["train", sys.argv[1]])
    except SystemExit as e:
        seen["exit"] = e.code
    print("SOCKETS " + json.dumps(seen), flush=True)
""")


def _loopback(hex_addr: str) -> bool:
    """Whether a /proc/net/tcp{,6} local address (hex, kernel byte order) is a loopback one."""
    host = hex_addr.split(":")[0]
    if len(host) == 8:
        return socket.inet_ntoa(bytes.fromhex(host)[::-1]).startswith("127.")
    words = [bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, 32, 8)]
    ip6 = b"".join(words)
    return ip6 == b"\0" * 15 + b"\1" or (ip6[:12] == b"\0" * 10 + b"\xff\xff" and ip6[12] == 127)


def _network_interface() -> str | None:
    """An interface that is up, other than the loopback one (None when there is none)."""
    for _, name in socket.if_nameindex():
        try:
            up = open(f"/sys/class/net/{name}/operstate").read().strip() == "up"
        except OSError:
            up = False
        if name != "lo" and up:
            return name
    return None


def test_a_one_process_run_listens_on_no_address_another_host_can_reach(tmp_path):
    (tmp_path / "spy.py").write_text(SCRIPT)
    recipe = tiny_recipe(tmp_path, trainer={"max_steps": 1, "eval_every": 0, "output_dir": str(tmp_path / "run")})
    env = cli_env()
    iface = _network_interface()
    if iface:   # as on a host whose name resolves to its network address: gloo's default there
        env["GLOO_SOCKET_IFNAME"] = iface
    proc = subprocess.run([sys.executable, str(tmp_path / "spy.py"), str(recipe)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    line = [x for x in proc.stdout.splitlines() if x.startswith("SOCKETS ")]
    assert line, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    seen = json.loads(line[-1][len("SOCKETS "):])
    assert seen.get("exit") in (None, 0) and "during" in seen, (seen, proc.stderr[-3000:])
    new = [a for a in seen["during"] if a not in seen["before"]]
    reachable = [a for a in new if not _loopback(a)]
    assert not reachable, f"listening on {reachable} (all new: {new})"


def test_loopback_addresses_are_read_from_proc_net():
    assert _loopback("0100007F:1F90") and not _loopback("00000000:1F90")
    assert _loopback("00000000000000000000000001000000:1F90")          # ::1
    assert not _loopback("00000000000000000000000000000000:1F90")      # ::
    assert _loopback("0000000000000000FFFF00000100007F:1F90")          # ::ffff:127.0.0.1
