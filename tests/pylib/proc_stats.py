"""proc_stats.py -- what the Python tests read about a process from /proc
(shared by redis/tests/test_functional.py and tests/rpc/test_add_server.py)."""

import os


def cpu_seconds(pid):
    """User + system CPU time of a process, from /proc/PID/stat (fields 14
    and 15, counted after the command name, which may hold spaces)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
