import os

import pytest

from planner.cpus import CpuSplit, split
from planner.errors import ConfigError


def test_the_last_cpus_go_to_the_client_and_the_rest_to_the_server():
    s = split(1, {0, 1})
    assert s == CpuSplit(server=(0,), client=(1,)) and s.bind_env() == "0"
    s = split(2, {0, 1, 2, 3, 5, 6, 7})
    assert s.client == (6, 7) and s.bind_env() == "0-3,5"
    assert split(0) is None


def test_a_split_that_leaves_the_server_nothing_is_refused():
    with pytest.raises(ConfigError, match=r"\[cpus\] client = 2 leaves no CPU for the server: this process may use 2"):
        split(2, {0, 1})


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="this process may use one CPU: there is nothing to split")
def test_defaults_to_this_process_affinity():
    mine = os.sched_getaffinity(0)
    s = split(1)
    assert set(s.server) | set(s.client) == mine
    assert s.client == (max(mine),) and max(mine) not in s.server
