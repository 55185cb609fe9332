"""redis_net.py -- the socket helpers the Redis test drivers share
(crash_test.py, test_functional.py): a free TCP port, a raw-RESP PING, and
waiting for a starting server to answer it."""
import socket
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def wait_for_ping(proc, port, timeout=30, step=0.01):
    """True once the server on port answers PING; False if proc exits first
    or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping(port):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(step)
    return False
