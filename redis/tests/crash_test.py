#!/usr/bin/env python3
"""Crash test of the durable Redis (docs/redis.md, issue #5).

Each round: start redis-server-durable on the pool (the first round creates
it), check the recovered state against every acknowledged write so far, run
concurrent clients (redis_crash_clients: SET/GET/DEL, HSET/HGET/HDEL, INCR,
MULTI/EXEC pairs, SET PX with a long TTL, keys with a TTL of a few ms, RPUSH,
job queues consumed by BLMOVE, BZPOPMIN and XREADGROUP on a small shared key set), SIGKILL the server after a random 100..600 ms
(or, in --shutdown-pct of the rounds, send it SHUTDOWN NOSAVE: a clean head
written under load), wait for the clients to notice. After the last round: restart, check once
more, then run the Porcupine linearizability checker (tests/linearizability)
over the history of all rounds (every string key, hash field, MULTI pair and
TTL key is a register, a delete writes nil; the reads of each check are part
of the history).

The check after a restart, per register: the recovered value must be the
value of a write W (acknowledged or of unknown outcome; a delete writes nil)
that no acknowledged write supersedes: W2 supersedes an acknowledged W if W2
was invoked after W's reply, and an unknown-outcome W if W2 belongs to a later
server epoch. Nil also if no write was ever acknowledged. A MULTI pair (string
ta<i> and field th.t<i>, written and deleted together in one MULTI/EXEC) must
hold the same value in both. A TTL key: PEXPIRETIME -1 if the recovered value
was written without a TTL, else within [sent, replied] + PX of its write (a
write cut off: [sent, kill] + PX); -2 if nil. Keys set with a TTL of at most
--short-px-max ms before the kill: gone (GET nil, PTTL -2; checked at least
that long after the kill). Per counter: every acknowledged INCR result is
distinct, the recovered value is >= the largest and <= the number of INCRs
sent. Per list: the list of the previous check, then only elements of RPUSHes
of the round that just ended, no duplicates, in real-time order, every
acknowledged RPUSH at the index its reply gave. Per job queue q<j> and its
destination qd<j> (BLMOVE q<j> qd<j>, often served while blocked): every
element of either was pushed to q<j>, none is in both or twice; every
acknowledged push is in one of them and every acknowledged BLMOVE's element
in qd<j>; the previous check's qd<j> is a prefix of the new one, and every
element found by the previous check is still in one of them. Per sorted-set
queue zq<j> (ZADD, BZPOPMIN): every member was added; no member an
acknowledged BZPOPMIN popped is back; every acknowledged ZADD's member, and
every member the previous check found, is there or popped: by an
acknowledged BZPOPMIN, or by a BZPOPMIN cut off by a kill in an epoch since
(one member each). Per stream queue sq<j> with group g (XADD, XREADGROUP >): entries
were sent, ids increase, every acknowledged XADD is there with its id;
every acknowledged delivery is at or below the group's last-delivered id,
whose pending list is exactly the entries up to it; the last-delivered id
never goes back and entries found before stay. KEYS * lists
no other key and agrees with DBSIZE.

Prints `rounds=R acked=A lost=L linearizable=true|false bad_replies=B` last
(B: error or unexpected replies the clients got); exit status 0 if nothing
was lost, no reply was bad and the history is linearizable, 1 otherwise, 2
on a setup error. Uses only the Python standard library.
"""
import argparse
import glob
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def log(msg):
    print(f"crash: {msg}", flush=True)


from redis_net import free_port, wait_for_ping  # noqa: E402  (shared with the other driver)


class Server:
    def __init__(self, args, work, env):
        self.args, self.work, self.env = args, work, env
        self.proc = None
        self.port = None

    def start(self, epoch, early_kill_ms=None):
        if early_kill_ms is not None:
            # a crash during start-up (often inside recovery): kill after early_kill_ms
            self.port = free_port()
            self.proc = subprocess.Popen(
                [self.args.server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--daemonize", "no",
                 "--logfile", os.path.join(self.work, f"server-{epoch}-early.log"), "--dir", self.work],
                env=self.env, stdin=subprocess.DEVNULL)
            time.sleep(early_kill_ms / 1000)
            self.kill()
            early = os.path.join(self.work, f"server-{epoch}-early.log")
            self.early_before_restored = not (os.path.exists(early) and "restored" in open(early).read())
        for attempt in range(5):
            self.port = free_port()
            logf = os.path.join(self.work, f"server-{epoch}.log")
            self.logf = logf
            self.proc = subprocess.Popen(
                [self.args.server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--daemonize", "no", "--logfile", logf, "--dir", self.work],
                env=self.env, stdin=subprocess.DEVNULL)
            if wait_for_ping(self.proc, self.port, step=0.02):
                return self.state()
            self.kill()
            text = open(logf, errors="replace").read() if os.path.exists(logf) else ""
            if "Address already in use" not in text:
                raise SystemExit(f"crash: server did not start (epoch {epoch}):\n{text[-3000:]}")
        raise SystemExit("crash: no free port")

    def state(self):
        text = open(self.logf, errors="replace").read()
        m = re.search(r"mode \w+: (FRESH|RECOVERED)", text)
        return m.group(1) if m else "?"

    def shutdown(self):
        """SHUTDOWN NOSAVE while the clients run: the runtime drains the
        pipeline and the backend and marks the pool's head clean, and the
        next start recovers from that head (without the search of the log
        ring a crash needs). The server must exit 0 within 30 s."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
                s.recv(256)  # nothing: the connection closes as the server exits
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            raise SystemExit("crash: the server did not exit within 30 s of SHUTDOWN")
        self.proc = None
        if rc != 0:
            raise SystemExit(f"crash: the server exited {rc} after SHUTDOWN (see {self.logf})")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait()
        self.proc = None


def bgsaves(port, every_s, stop, counts):
    """Send BGSAVE every every_s seconds until stop is set (the server's
    kill ends it). Each child is slowed to 20 ms a key (rdb-key-save-delay),
    so that kills land while one writes the snapshot: it must neither write
    the pool nor keep the restart out (it outlives the server by up to a
    second)."""
    def command(*words):
        msg = b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(msg)
            return s.recv(256)
    try:
        command(b"CONFIG", b"SET", b"rdb-key-save-delay", b"20000")
        while not stop.wait(every_s):
            counts["started" if command(b"BGSAVE").startswith(b"+") else "refused"] += 1
    except OSError:
        return


def pool_snapshots(port, every_s, stop, counts, work, epoch):
    """Send MANGOSNAPSHOT to a new path every every_s seconds until stop is
    set: kills land while a writer works. Its fork must not disturb the
    server's log, and a snapshot path must only ever hold a complete pool
    (checked after the run)."""
    def command(*words):
        msg = b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(msg)
            return s.recv(256)
    i = 0
    try:
        while not stop.wait(every_s):
            i += 1
            path = os.path.join(work, f"snap-{epoch}-{i}.pool").encode()
            counts["scheduled" if command(b"MANGOSNAPSHOT", path).startswith(b"+") else "refused"] += 1
    except OSError:
        return


def check_snapshots(work, cli):
    """Every snapshot left in work must check as a pool: (complete, bad,
    names of the bad ones, a dead writer's temporary files)."""
    done = sorted(f for f in os.listdir(work) if re.fullmatch(r"snap-\d+-\d+\.pool", f))
    bad = []
    for f in done:
        r = subprocess.run([cli, "check", "--quiet", os.path.join(work, f)], capture_output=True, text=True)
        if r.returncode != 0:
            bad.append(f"{f}: {r.stderr.strip()[:300]}")
    tmp = [f for f in os.listdir(work) if re.fullmatch(r"snap-\d+-\d+\.pool\.tmp\.\d+", f)]
    return len(done), len(bad), bad, len(tmp)


HKEY_HASH, HKEY_PAIR, HKEY_TTL = 1000, 20000, 30000


def reg_name(k):
    """The Redis key(s) of history key k (redis_crash_clients.c)."""
    if k >= HKEY_TTL:
        return f"x{k - HKEY_TTL}"
    if k >= HKEY_PAIR:
        return f"pair ta{k - HKEY_PAIR}+th.t{k - HKEY_PAIR}"
    if k >= HKEY_HASH:
        return f"h{(k - HKEY_HASH) // 100}.f{(k - HKEY_HASH) % 100}"
    return f"k{k}"


class Model:
    """Writes and acknowledgements of all finished epochs."""

    def __init__(self):
        self.writes = {}        # hkey -> {vid: (epoch, call, ret or None)}
        self.dels = {}          # hkey -> [(epoch, call, ret or None)] (writes of nil)
        self.max_acked_call = {}  # hkey -> latest invocation time of an acknowledged write
        self.max_acked_epoch = {}  # hkey -> latest epoch with an acknowledged write
        self.acked_rets = {}    # hkey -> [return times of acknowledged writes]
        self.incr_sent = {}     # counter -> INCRs sent
        self.incr_acked = {}    # counter -> [results]
        self.ttl = {}           # (hkey, vid) -> [px, wall ms before sending, wall ms after the reply or None]
        self.kill_wall_ms = {}  # epoch -> wall-clock ms right after the kill
        self.pushes = {}        # list -> {vid: [epoch, call, ret or None, length or None]}
        self.list_prev = {}     # list -> contents found by the previous check
        self.queue_sent = {}    # queue -> {vid: epoch} (pushes sent)
        self.queue_pushed = {}  # queue -> {vid} (acknowledged pushes)
        self.queue_moved = {}   # queue -> {vid} (acknowledged BLMOVEs, by the element moved)
        self.queue_prev = {}    # queue -> (queue, destination) found by the previous check
        self.zq_sent = {}       # sorted-set queue -> {vid: epoch} (ZADDs sent)
        self.zq_pushed = {}     # sorted-set queue -> {vid} (acknowledged ZADDs)
        self.zq_popped = {}     # sorted-set queue -> {vid} (acknowledged BZPOPMINs, by the member popped)
        self.zq_cut_off = {}    # sorted-set queue -> {epoch: BZPOPMINs of unknown outcome (cut off by the kill)}
        self.zq_prev = {}       # sorted-set queue -> (members found by the previous check, its epoch)
        self.sq_sent = {}       # stream queue -> {vid} (XADDs sent)
        self.sq_added = {}      # stream queue -> {vid: entry id} (acknowledged XADDs)
        self.sq_read = {}       # stream queue -> {entry id: vid} (acknowledged deliveries to group g)
        self.sq_prev = {}       # stream queue -> ({entry id: vid}, last-delivered id) of the previous check
        self.acked = 0
        self.kinds = {}         # acknowledged writes by kind
        self.checked = {"short": 0, "ttl": 0, "list_elems": 0, "queue_elems": 0}

    def add_epoch(self, hist, epoch, kill_wall_ms):
        self.kill_wall_ms[epoch] = kill_wall_ms
        for path in glob.glob(os.path.join(hist, f"client-{epoch}-*.log")):
            inv = {}
            with open(path) as f:
                for line in f:
                    if not line.endswith("\n"):
                        continue
                    p = line.split()
                    if p[0] == "I" and p[4] == "PUT":
                        inv[p[1]] = (int(p[3]), int(p[5]), int(p[6]))
                    elif p[0] == "R" and p[1] in inv:
                        k, vid, call = inv.pop(p[1])
                        self._add_write(k, vid, (epoch, call, int(p[3])))
                        self.max_acked_call[k] = max(self.max_acked_call.get(k, 0), call)
                        self.max_acked_epoch[k] = epoch
                        self.acked_rets.setdefault(k, []).append(int(p[3]))
            for k, vid, call in inv.values():  # no reply: outcome unknown
                self._add_write(k, vid, (epoch, call, None))
        for path in glob.glob(os.path.join(hist, f"ack-{epoch}-*.log")):
            with open(path) as f:
                for line in f:
                    p = line.split()
                    if len(p) == 2 and line.endswith("\n") and p[0] in ("Y", "T"):  # a BZPOPMIN sent; timed out
                        d = self.zq_cut_off.setdefault(p[1], {})
                        d[epoch] = d.get(epoch, 0) + (1 if p[0] == "Y" else -1)
                    if len(p) < 3 or not line.endswith("\n"):
                        continue
                    if p[0] == "N":
                        self.incr_sent[p[2]] = self.incr_sent.get(p[2], 0) + 1
                    elif p[0] == "X":
                        self.ttl[(int(p[1]), int(p[2]))] = [int(p[3]), int(p[4]), None]
                    elif p[0] == "P":
                        self.pushes.setdefault(p[1], {})[int(p[2])] = [epoch, int(p[3]), None, None]
                    elif p[0] == "Q":
                        self.queue_sent.setdefault(p[1], {})[int(p[2])] = epoch
                    elif p[0] == "Z":
                        self.zq_sent.setdefault(p[1], {})[int(p[2])] = epoch
                    elif p[0] == "S":
                        self.sq_sent.setdefault(p[1], set()).add(int(p[2]))
                    elif p[0] == "A":
                        self.acked += 1
                        self.kinds[p[1]] = self.kinds.get(p[1], 0) + 1
                        if p[1] == "INCR":
                            self.incr_acked.setdefault(p[2], []).append(int(p[3]))
                        elif p[1] == "SETX":
                            self.ttl[(int(p[2]), int(p[3]))][2] = int(p[4])
                        elif p[1] == "RPUSH":
                            w = self.pushes[p[2]][int(p[3])]
                            w[3], w[2] = int(p[4]), int(p[5])
                        elif p[1] == "QPUSH":
                            self.queue_pushed.setdefault(p[2], set()).add(int(p[3]))
                        elif p[1] == "QMOVE":
                            self.queue_moved.setdefault(p[2], set()).add(int(p[3]))
                        elif p[1] == "ZPUSH":
                            self.zq_pushed.setdefault(p[2], set()).add(int(p[3]))
                        elif p[1] == "ZPOP":
                            self.zq_popped.setdefault(p[2], set()).add(int(p[3]))
                            d = self.zq_cut_off.setdefault(p[2], {})
                            d[epoch] = d.get(epoch, 0) - 1
                        elif p[1] == "XADD":
                            self.sq_added.setdefault(p[2], {})[int(p[3])] = p[4]
                        elif p[1] == "XREAD":
                            self.sq_read.setdefault(p[2], {})[p[3]] = int(p[4])

    def _add_write(self, k, vid, w):
        if vid == 0:
            self.dels.setdefault(k, []).append(w)
        else:
            self.writes.setdefault(k, {})[vid] = w

    def _not_superseded(self, k, w):
        epoch, call, ret = w
        if ret is not None:
            return self.max_acked_call.get(k) is None or self.max_acked_call[k] <= ret
        return self.max_acked_epoch.get(k, 0) <= epoch

    def check_register(self, k, v, detail=""):
        """Returns (lost acknowledged writes, description) for recovered value v."""
        acked_call = self.max_acked_call.get(k)
        if v == "torn":
            return max(1, self._latest_acked(k)), f"a value no write wrote {detail}".strip()
        v = int(v)
        if v == 0:
            if acked_call is None or any(self._not_superseded(k, d) for d in self.dels.get(k, [])):
                return 0, None
            return self._latest_acked(k), "nil, but writes were acknowledged after the last delete"
        w = self.writes.get(k, {}).get(v)
        if w is None:
            return max(1, self._latest_acked(k)), f"value {v} was never written"
        if self._not_superseded(k, w):
            return 0, None
        return self._latest_acked(k), f"value {v} (epoch {w[0]}) was superseded by an acknowledged write"

    def check_ttl(self, k, v, t):
        """PEXPIRETIME t of TTL register k whose recovered value is v: -2 if nil,
        -1 if v was written without a TTL, else within the write's window."""
        self.checked["ttl"] += 1
        if v == "torn":
            return 0, None  # reported by check_register
        v = int(v)
        if v == 0:
            return (0, None) if t == -2 else (1, f"nil, but PEXPIRETIME {t}")
        info = self.ttl.get((k, v))
        if info is None:
            return 0, None  # never written: reported by check_register
        px, before, after = info
        if px == 0:
            return (0, None) if t == -1 else (1, f"value {v} was written without a TTL, PEXPIRETIME {t}")
        if t == -1:
            return 1, f"value {v} was written with PX {px}, but the key has no TTL (became persistent)"
        hi = (after if after is not None else self.kill_wall_ms[v >> 40]) + px
        if not before + px - 1 <= t <= hi + 1:
            return 1, f"value {v} was written with PX {px} in [{before}, {hi - px}] ms, PEXPIRETIME {t}"
        return 0, None

    def _latest_acked(self, k):
        # acknowledged writes no other acknowledged write supersedes
        c = self.max_acked_call.get(k)
        return 0 if c is None else sum(1 for r in self.acked_rets[k] if r >= c)

    def check_counter(self, name, v):
        lost, why = 0, []
        results = self.incr_acked.get(name, [])
        dups = len(results) - len(set(results))
        if dups:
            lost += dups
            why.append(f"{dups} acknowledged INCR results repeated (an acknowledged INCR was lost)")
        if v == "bad":
            return lost + max(1, len(results)), "not an integer"
        v = int(v)
        hi = max(results, default=0)
        if v < hi:
            lost += sum(1 for r in results if r > v)
            why.append(f"value {v} < largest acknowledged INCR result {hi}")
        if v > self.incr_sent.get(name, 0):
            lost += 1
            why.append(f"value {v} > {self.incr_sent.get(name, 0)} INCRs sent")
        return lost, "; ".join(why) or None

    def check_list(self, name, items, last_epoch):
        """The recovered list: the list of the previous check, then pushes of
        the epoch that just ended (last_epoch), no duplicates, in an order
        that respects real time; every acknowledged RPUSH at the index its
        reply gave (length - 1)."""
        lost, why = 0, []
        pushes = self.pushes.get(name, {})
        prev = self.list_prev.get(name, [])
        self.list_prev[name] = items
        self.checked["list_elems"] += len(items)
        if items[:len(prev)] != prev:
            n = sum(1 for a, b in zip(prev, items) if a != b) + max(0, len(prev) - len(items))
            lost += n
            why.append(f"{n} elements of the previously recovered list changed or missing")
        missing = [vid for vid, w in pushes.items() if w[3] is not None and
                   (w[3] > len(items) or items[w[3] - 1] != str(vid))]
        if missing:
            lost += len(missing)
            why.append(f"{len(missing)} acknowledged RPUSHes not at the index of their reply (e.g. {missing[0]})")
        seen = set()
        min_ret = None  # smallest return time among the later new elements
        for i in range(len(items) - 1, len(prev) - 1, -1):
            e = items[i]
            w = pushes.get(int(e)) if e != "torn" else None
            if w is None:
                lost += 1
                why.append(f"element {i} = {e} was never pushed to {name}")
                continue
            if e in seen:
                lost += 1
                why.append(f"element {e} twice")
            seen.add(e)
            if w[0] != last_epoch:
                lost += 1
                why.append(f"element {e} of epoch {w[0]} appears after the restart that followed it")
            if min_ret is not None and min_ret < w[1]:
                lost += 1
                why.append(f"element {e} at {i} comes before an RPUSH acknowledged before it was sent")
            if w[2] is not None:
                min_ret = w[2] if min_ret is None else min(min_ret, w[2])
        return lost, "; ".join(why[:5]) or None


    def check_queue(self, name, waiting, moved):
        """The recovered queue (waiting) and its BLMOVE destination (moved)."""
        lost, why = 0, []
        sent = self.queue_sent.get(name, {})
        found = waiting + moved
        self.checked["queue_elems"] += len(found)
        unknown = [e for e in found if e == "torn" or int(e) not in sent]
        if unknown:
            lost += len(unknown)
            why.append(f"{len(unknown)} elements never pushed (e.g. {unknown[0]})")
        if len(set(found)) != len(found):
            n = len(found) - len(set(found))
            lost += n
            why.append(f"{n} elements twice (in the queue and its destination, or repeated)")
        have = set(found)
        missing = [v for v in self.queue_pushed.get(name, ()) if str(v) not in have]
        if missing:
            lost += len(missing)
            why.append(f"{len(missing)} acknowledged pushes in neither list (e.g. {missing[0]})")
        in_moved = set(moved)
        unmoved = [v for v in self.queue_moved.get(name, ()) if str(v) not in in_moved]
        if unmoved:
            lost += len(unmoved)
            why.append(f"{len(unmoved)} acknowledged BLMOVEs whose element is not in the destination "
                       f"(e.g. {unmoved[0]})")
        prev_waiting, prev_moved = self.queue_prev.get(name, ([], []))
        self.queue_prev[name] = (waiting, moved)
        if moved[:len(prev_moved)] != prev_moved:
            lost += 1
            why.append("the previously recovered destination is not a prefix of this one")
        gone = [e for e in prev_waiting + prev_moved if e not in have]
        if gone:
            lost += len(gone)
            why.append(f"{len(gone)} elements recovered before are gone (e.g. {gone[0]})")
        return lost, "; ".join(why[:5]) or None


    def check_zqueue(self, name, found, epoch):
        """The recovered sorted-set queue (checked at the start of epoch):
        members ZADDed and not popped."""
        lost, why = 0, []
        self.checked["queue_elems"] += len(found)
        sent = self.zq_sent.get(name, {})
        unknown = [e for e in found if e == "torn" or int(e) not in sent]
        if unknown:
            lost += len(unknown)
            why.append(f"{len(unknown)} members never added (e.g. {unknown[0]})")
        have = {int(e) for e in found if e != "torn"}
        popped = self.zq_popped.get(name, set())
        back = sorted(have & popped)
        if back:
            lost += len(back)
            why.append(f"{len(back)} members an acknowledged BZPOPMIN popped are back (e.g. {back[0]})")
        # A member that must be there (an acknowledged ZADD's, or one the
        # previous check found) and is not was popped: by an acknowledged
        # BZPOPMIN, or by one cut off by a kill, in an epoch at or after the
        # one from which it had to be there. Each cut-off pop explains one
        # member at most: for every epoch t, the members missing since t or
        # later may not outnumber the cut-off pops of epochs t and later.
        prev, prev_epoch = self.zq_prev.get(name, (set(), 0))
        self.zq_prev[name] = (have, epoch)
        since = {}
        for v in self.zq_pushed.get(name, set()) - have - popped:
            since[v] = sent[v]
        for v in prev - have - popped:
            since[v] = max(since.get(v, 0), prev_epoch)
        cut_off = self.zq_cut_off.get(name, {})
        excess, missing, pops = 0, 0, 0
        for t in sorted(set(since.values()) | set(cut_off), reverse=True):
            missing += sum(1 for e in since.values() if e == t)
            pops += max(0, cut_off.get(t, 0))
            excess = max(excess, missing - pops)
        if excess:
            lost += excess
            example = min(since, key=lambda v: -since[v])
            why.append(f"{len(since)} members that must be there are neither there nor popped by an "
                       f"acknowledged BZPOPMIN, {excess} more than the BZPOPMINs of unknown outcome since "
                       f"(e.g. {example})")
        return lost, "; ".join(why) or None

    def check_squeue(self, name, entries, last, pending):
        """The recovered stream queue: every acknowledged XADD is there; group
        g's last-delivered id covers every acknowledged delivery, and its
        pending list is exactly the entries up to that id (none is
        acknowledged with XACK), so no job is delivered twice or lost."""
        lost, why = 0, []
        self.checked["queue_elems"] += len(entries)

        def key(i):
            ms, seq = i.split("-")
            return (int(ms), int(seq))

        ids = [i for i, _ in entries]
        if [key(i) for i in ids] != sorted({key(i) for i in ids}):
            lost += 1
            why.append("entry ids not increasing")
        sent = self.sq_sent.get(name, set())
        by_id = dict(entries)
        unknown = [v for v in by_id.values() if v == "torn" or int(v) not in sent]
        if unknown:
            lost += len(unknown)
            why.append(f"{len(unknown)} entries no XADD sent (e.g. {unknown[0]})")
        vids = list(by_id.values())
        if len(set(vids)) != len(vids):
            lost += len(vids) - len(set(vids))
            why.append("a value in two entries")
        gone = [(v, i) for v, i in self.sq_added.get(name, {}).items() if by_id.get(i) != str(v)]
        if gone:
            lost += len(gone)
            why.append(f"{len(gone)} acknowledged XADDs not there (e.g. {gone[0][1]})")
        if last == "none":
            # created and acknowledged before any client of an epoch sends
            # an XADD (redis_crash_clients' create_groups)
            if sent:
                lost += 1
                why.append("consumer group g is gone")
            return lost, "; ".join(why) or None
        unread = [i for i in self.sq_read.get(name, {}) if key(i) > key(last)]
        if unread:
            lost += len(unread)
            why.append(f"{len(unread)} acknowledged deliveries past the group's last-delivered id {last} "
                       f"(would be delivered again; e.g. {unread[0]})")
        wrong = [(i, v) for i, v in self.sq_read.get(name, {}).items() if by_id.get(i) != str(v)]
        if wrong:
            lost += len(wrong)
            why.append(f"{len(wrong)} delivered entries missing or changed (e.g. {wrong[0][0]})")
        delivered = {i for i in ids if key(i) <= key(last)}
        if set(pending) != delivered or len(set(pending)) != len(pending):
            lost += 1
            why.append(f"pending list ({len(pending)}) is not the {len(delivered)} entries up to {last}")
        prev_entries, prev_last = self.sq_prev.get(name, ({}, "0-0"))
        self.sq_prev[name] = (by_id, last)
        if key(last) < key(prev_last):
            lost += 1
            why.append(f"last-delivered id went back from {prev_last} to {last}")
        lost_prev = [i for i, v in prev_entries.items() if by_id.get(i) != v]
        if lost_prev:
            lost += len(lost_prev)
            why.append(f"{len(lost_prev)} entries recovered before are gone (e.g. {lost_prev[0]})")
        return lost, "; ".join(why[:5]) or None


def client_args(args, port, epoch, hist):
    return ["--port", str(port), "--epoch", str(epoch), "--dir", hist, "--clients", str(args.nclients),
            "--keys", str(args.keys), "--hashes", str(args.hashes), "--fields", str(args.fields),
            "--counters", str(args.counters), "--pairs", str(args.pairs), "--ttl-keys", str(args.ttl_keys),
            "--short-keys", str(args.short_keys), "--lists", str(args.lists), "--queues", str(args.queues),
            "--long-px", str(args.long_px), "--short-px-max", str(args.short_px_max)]


def verify(args, server, model, epoch, hist):
    out = subprocess.run([args.clients, "dump"] + client_args(args, server.port, epoch, hist),
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"crash: dump failed ({out.returncode}): {out.stderr}")
    lost = 0
    regs, names, dbsize = {}, None, None
    queues = {}  # queue -> {"queue": elements, "moved": elements}
    streams = {}  # stream queue -> {"stream": [(id, vid)], "group": last id, "pending": [ids]}

    def report(name, n, why):
        nonlocal lost
        if why:
            log(f"epoch {epoch}: LOST on {name}: {why} ({n} acknowledged writes)")
        lost += n

    for line in out.stdout.splitlines():
        p = line.split()
        kind = p[0]
        if kind == "reg":
            k = int(p[1])
            regs[k] = p[2]
            n, why = model.check_register(k, p[2], " ".join(p[3:]))
            report(reg_name(k), n, why)
        elif kind == "ttl":
            k = int(p[1])
            n, why = model.check_ttl(k, regs[k], int(p[2]))
            report(f"{reg_name(k)} (TTL)", n, why)
        elif kind == "ctr":
            report(p[1], *model.check_counter(p[1], p[2]))
        elif kind == "short":
            model.checked["short"] += 1
            if p[2] != "0" or p[3] != "-2":
                report(p[1], 1, f"short-TTL key still there after its TTL: value {p[2]}, PTTL {p[3]}")
        elif kind == "list":
            items = p[3:]
            if int(p[2]) != len(items):
                report(p[1], 1, "LRANGE cut short")
            report(p[1], *model.check_list(p[1], items, epoch - 1))
        elif kind in ("queue", "moved"):
            if int(p[2]) != len(p[3:]):
                report(p[1], 1, "LRANGE cut short")
            queues.setdefault(p[1], {})[kind] = p[3:]
        elif kind == "zset":
            if int(p[2]) != len(p[3:]):
                report(p[1], 1, "ZRANGE cut short")
            report(f"{p[1]} (sorted-set queue)", *model.check_zqueue(p[1], p[3:], epoch))
        elif kind == "stream":
            if int(p[2]) != len(p[3:]):
                report(p[1], 1, "XRANGE cut short")
            streams.setdefault(p[1], {})["stream"] = [tuple(e.split(":")) for e in p[3:]]
        elif kind == "group":
            streams.setdefault(p[1], {})["group"] = p[2]
        elif kind == "pending":
            if int(p[2]) != len(p[3:]):
                report(p[1], 1, "XPENDING cut short")
            streams.setdefault(p[1], {})["pending"] = p[3:]
        elif kind == "keys":
            names = p[1:]
        elif kind == "dbsize":
            dbsize = int(p[1])
    for name, q in sorted(queues.items()):
        report(f"{name} (queue)", *model.check_queue(name, q.get("queue", []), q.get("moved", [])))
    for name, q in sorted(streams.items()):
        report(f"{name} (stream queue)", *model.check_squeue(name, q.get("stream", []), q.get("group", "none"),
                                                               q.get("pending", [])))
    known = re.compile(r"^(k\d+|h\d+|c\d+|ta\d+|th|x\d+|l\d+|q\d+|qd\d+|zq\d+|sq\d+)$")
    odd = [n for n in names if not known.match(n)]
    if odd:
        report("KEYS *", len(odd), f"unexpected keys: {' '.join(sorted(odd)[:10])}")
    if dbsize != len(names):
        report("DBSIZE", 1, f"DBSIZE {dbsize} but KEYS * lists {len(names)} keys")
    return lost


def lincheck_binary(args, work):
    if args.lincheck:
        return args.lincheck
    if not args.go:
        return None
    out = os.path.join(work, "lincheck")
    r = subprocess.run([args.go, "build", "-buildvcs=false", "-o", out, "."], cwd=args.lincheck_src)
    if r.returncode != 0:
        raise SystemExit("crash: building the linearizability checker failed")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True, help="redis-server-durable")
    ap.add_argument("--clients", required=True, help="redis_crash_clients")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--mode", default="sim", help="MANGO_MODE (sim: a kill is a power failure)")
    ap.add_argument("--nclients", type=int, default=4)
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--hashes", type=int, default=2)
    ap.add_argument("--fields", type=int, default=4)
    ap.add_argument("--counters", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=4, help="MULTI/EXEC pairs (string + hash field)")
    ap.add_argument("--ttl-keys", type=int, default=4, help="registers written with SET PX <long-px> or SET")
    ap.add_argument("--short-keys", type=int, default=16, help="keys written with a TTL of 1..short-px-max ms")
    ap.add_argument("--lists", type=int, default=2)
    ap.add_argument("--queues", type=int, default=1,
                    help="job queues of each kind: list (RPUSH, BLMOVE to a destination list), "
                         "sorted set (ZADD, BZPOPMIN), stream with a consumer group (XADD, XREADGROUP)")
    ap.add_argument("--long-px", type=int, default=3600000)
    ap.add_argument("--short-px-max", type=int, default=50)
    ap.add_argument("--think-us", type=int, default=100)
    ap.add_argument("--min-ms", type=int, default=100)
    ap.add_argument("--max-ms", type=int, default=600)
    ap.add_argument("--startup-kill-pct", type=int, default=20,
                    help="percent of restarts first killed 0..30 ms after exec (in start-up/recovery)")
    ap.add_argument("--lincheck", help="the checker binary (else built with --go)")
    ap.add_argument("--go", help="go, to build the checker from --lincheck-src")
    ap.add_argument("--lincheck-src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                            "..", "..", "tests", "linearizability"))
    ap.add_argument("--lincheck-timeout", default="150s")
    ap.add_argument("--lincheck-explain-timeout", default="20s",
                    help="time the checker may spend explaining a history it found not linearizable "
                         "(the verdict stands either way)")
    ap.add_argument("--pool", help="pool file (default /dev/shm/mango-redis-crash.<pid>.pool); deleted at "
                    "the end unless a write was lost or the run stopped early")
    ap.add_argument("--work", help="work folder (default: a new one under /tmp, removed on success)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--bgsave-ms", type=int, default=0,
                    help="send BGSAVE every N ms during each round (0: never): kills land during fork children")
    ap.add_argument("--snapshot-ms", type=int, default=0,
                    help="send MANGOSNAPSHOT (a new path each time) every N ms during each round (0: never); "
                         "every snapshot left must then pass `mango check` (--mango-cli)")
    ap.add_argument("--shutdown-pct", type=int, default=0,
                    help="end this percent of the rounds with SHUTDOWN NOSAVE under load instead of SIGKILL "
                         "(0: never): a clean head, written while clients write, then a restart from it")
    ap.add_argument("--mango-cli", default=os.environ.get("MANGO_CLI", "mango"),
                    help="the mango CLI, for --snapshot-ms (default $MANGO_CLI, else mango on PATH)")
    args = ap.parse_args()
    if args.snapshot_ms and not shutil.which(args.mango_cli):
        print(f"crash: --snapshot-ms needs the mango CLI: {args.mango_cli} not found", file=sys.stderr)
        return 2
    for b in (args.server, args.clients):
        if not os.access(b, os.X_OK):
            print(f"crash: no executable {b}", file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)

    if args.work:  # reused: clear only what an earlier run left there
        work = args.work
        os.makedirs(work, exist_ok=True)
        shutil.rmtree(os.path.join(work, "history"), ignore_errors=True)
        for f in (glob.glob(os.path.join(work, "server-*.log")) + glob.glob(os.path.join(work, "*.rdb")) +
                  glob.glob(os.path.join(work, "snap-*.pool*"))):
            os.unlink(f)  # (an earlier run's BGSAVE file would be imported by the new pool; its snapshots counted)
    else:
        work = tempfile.mkdtemp(prefix="mango-redis-crash.")
    hist = os.path.join(work, "history")
    os.makedirs(hist)
    if args.pool:
        pool = args.pool
    else:
        shm = "/dev/shm"
        pooldir = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else work
        pool = os.path.join(pooldir, f"mango-redis-crash.{os.getpid()}.pool")
    env = dict(os.environ, MANGO_POOL=pool, MANGO_MODE=args.mode, MANGO_CHECK_HEAP="1")
    env.setdefault("MANGO_POOL_SIZE", "256m")
    env.setdefault("MANGO_LOG_SIZE", "32m")
    if os.path.exists(pool):
        os.unlink(pool)
    checker = lincheck_binary(args, work)
    log(f"server {args.server}, mode {args.mode}, pool {pool}, {args.rounds} rounds, {args.nclients} clients, "
        f"{args.keys} keys + {args.hashes}x{args.fields} hash fields + {args.counters} counters + "
        f"{args.pairs} MULTI pairs + {args.ttl_keys} TTL keys + {args.short_keys} short-TTL keys + "
        f"{args.lists} lists + {args.queues} queues, seed {seed}, "
        f"work {work}")

    server = Server(args, work, env)
    model = Model()
    lost = 0
    ops = 0
    startup_kills = startup_kills_unfinished = 0
    shutdowns = 0
    bgsave_counts = {"started": 0, "refused": 0}
    snapshot_counts = {"scheduled": 0, "refused": 0}
    bad_replies = 0
    t_start = time.monotonic()
    kill_wall = None
    finished = False
    try:
        for epoch in range(1, args.rounds + 2):
            early = None
            if epoch > 1 and rng.randrange(100) < args.startup_kill_pct:
                early = rng.uniform(0, 30)
            state = server.start(epoch, early)
            if early is not None:
                startup_kills += 1
                startup_kills_unfinished += server.early_before_restored
            if epoch > 1 and args.mode not in ("none",) and state != "RECOVERED":
                log(f"epoch {epoch}: server log says {state}, not RECOVERED")
            if kill_wall is not None:  # every short TTL set before the kill has expired
                time.sleep(max(0.0, kill_wall + (args.short_px_max + 5) / 1000 - time.time()))
            round_lost = verify(args, server, model, epoch, hist)
            lost += round_lost
            if epoch == args.rounds + 1:
                log(f"final restart ({state}): lost={round_lost}")
                break
            cl = subprocess.Popen([args.clients, "run"] + client_args(args, server.port, epoch, hist) +
                                  ["--seconds", "20", "--think-us", str(args.think_us),
                                   "--seed", str(rng.randrange(1 << 62))],
                                  stdout=subprocess.PIPE, text=True)
            delay = rng.uniform(args.min_ms, args.max_ms) / 1000
            saver_stop = threading.Event()
            saver = None
            if args.bgsave_ms:
                saver = threading.Thread(target=bgsaves, args=(server.port, args.bgsave_ms / 1000, saver_stop,
                                                              bgsave_counts))
                saver.start()
            elif args.snapshot_ms:
                saver = threading.Thread(target=pool_snapshots, args=(server.port, args.snapshot_ms / 1000,
                                                                      saver_stop, snapshot_counts, work, epoch))
                saver.start()
            time.sleep(delay)
            clean = args.shutdown_pct > 0 and rng.randrange(100) < args.shutdown_pct
            if clean:
                server.shutdown()
                shutdowns += 1
            else:
                server.kill()
            saver_stop.set()
            if saver:
                saver.join()
            kill_wall = time.time()
            try:
                out, _ = cl.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                cl.kill()
                raise SystemExit("crash: the clients did not stop after the kill")
            m = re.search(r"ops=(\d+) acked_writes=(\d+) broken=(\d+) bad_replies=(\d+)", out)
            if not m:
                raise SystemExit(f"crash: unexpected client output: {out!r}")
            ops += int(m.group(1))
            bad_replies += int(m.group(4))
            model.add_epoch(hist, epoch, int(kill_wall * 1000) + 1)
            after = " (after a kill at start-up)" if early is not None else ""
            log(f"round {epoch}: start {state}{after}, verify lost={round_lost}, "
                f"{'shut down' if clean else 'killed'} after {delay * 1000:.0f} ms: ops={m.group(1)} "
                f"acked_writes={m.group(2)} "
                f"cut_off={m.group(3)}")
        finished = True
    finally:
        server.kill()
        # A pool that lost a write, or a run that stopped on an error, is
        # evidence: kept, with the history and logs in the work folder.
        if os.path.exists(pool):
            if finished and lost == 0:
                os.unlink(pool)
            else:
                log(f"crash: the pool is kept at {pool} (lost={lost}{'' if finished else ', the run stopped early'})")
    elapsed = time.monotonic() - t_start

    if checker:
        r = subprocess.run([checker, "-timeout", args.lincheck_timeout,
                            "-explain-timeout", args.lincheck_explain_timeout, hist], capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        lin = {0: "true", 1: "false"}.get(r.returncode, "unknown")
    else:
        log("no checker (neither --lincheck nor --go): history not checked")
        lin = "unchecked"
    ok = lost == 0 and bad_replies == 0 and lin in ("true", "unchecked")
    snap_note = ""
    if args.snapshot_ms:
        n_done, n_bad, bad_list, n_tmp = check_snapshots(work, args.mango_cli)
        for b in bad_list:
            log(f"snapshot does not check: {b}")
        ok = ok and n_bad == 0
        snap_note = (f"; MANGOSNAPSHOTs scheduled {snapshot_counts['scheduled']}, refused (one running) "
                     f"{snapshot_counts['refused']}; snapshots left {n_done}, checked ok {n_done - n_bad}, "
                     f"bad {n_bad}; killed writers' files {n_tmp}")
    log(f"{elapsed:.1f} s, ops={ops} bad_replies={bad_replies} startup_kills={startup_kills} "
        f"({startup_kills_unfinished} before recovery finished), shutdowns={shutdowns}, logs in {hist}")
    log("acknowledged writes by kind: " + " ".join(f"{k}={v}" for k, v in sorted(model.kinds.items())) +
        f"; checked after restarts: {model.checked['ttl']} TTLs, {model.checked['short']} short-TTL keys, "
        f"{model.checked['list_elems']} list elements, {model.checked['queue_elems']} queue elements" +
        (f"; BGSAVEs started {bgsave_counts['started']}, refused (one running) {bgsave_counts['refused']}"
         if args.bgsave_ms else "") + snap_note)
    print(f"rounds={args.rounds} acked={model.acked} lost={lost} linearizable={lin} bad_replies={bad_replies}",
          flush=True)
    if ok and not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    elif ok and not args.keep:
        shutil.rmtree(hist, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
