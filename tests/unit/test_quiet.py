"""The look at the machine before the load, and finding a replay's server from its port."""

import os
import socket
import subprocess
import sys
import time

import pytest

from planner import quiet


def test_loopback_hosts():
    assert quiet.is_loopback("127.0.0.1") and quiet.is_loopback("localhost") and quiet.is_loopback("[::1]")
    assert not quiet.is_loopback("10.0.0.5") and not quiet.is_loopback("gpu-node-3")


def test_a_loopback_server_is_found_from_its_listening_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        where = quiet.locate_server(f"http://127.0.0.1:{port}/")
    assert where.pids == (os.getpid(),) and not where.remote and where.note is None


def test_a_port_nobody_listens_on_is_said():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
        where = quiet.locate_server(f"http://localhost:{port}")
    assert where.pids == () and "nothing listens on port" in where.note


def test_a_remote_server_cannot_be_seen():
    where = quiet.locate_server("http://10.1.2.3:8000")
    assert where.remote and "cannot be seen from here" in where.note


@pytest.mark.timeout(30)
def test_a_busy_machine_is_named_and_require_quiet_makes_it_an_error():
    cpu = sorted(os.sched_getaffinity(0))[0]
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"], start_new_session=True
    )
    try:
        time.sleep(0.3)
        check = quiet.check_machine(set(), server_cpus=[cpu], planner_cpus=[cpu], watch_s=1.0)
    finally:
        hog.kill()
        hog.wait()
    assert check.busy
    assert check.line.startswith("the machine is busy: load average")
    assert f"(pid {hog.pid}," in check.line
    assert quiet.enforce(check, require_quiet=False) == check.line
    with pytest.raises(quiet.NotQuiet, match="--require-quiet: the machine is busy"):
        quiet.enforce(check, require_quiet=True)


def test_a_foreign_gpu_process_makes_the_machine_busy():
    check = quiet.check_machine(set(), foreign_gpu=["burn (pid 9) on GPU 0"], watch_s=0.05, busy_share=1.0)
    assert check.busy and "on the GPUs that will serve: burn (pid 9) on GPU 0" in check.line
