#!/bin/bash
# flush_then_big.sh [REDIS_DURABLE]: 600 000 small SETs into a 128 MiB pool,
# FLUSHALL, then 1 MB SETs until one fails (docs/redis.md, "Reclaiming what
# small keys leave behind"). Before the reclaim the first one aborted Redis.
set -u
D=/tmp/strand; rm -rf $D; mkdir -p $D
B=${1:-build/redis-work/redis-server-durable}
$B --port 7311 --save '' --appendonly no --mango-pool $D/p.pool --mango-mode emulated --mango-pool-size 128m --dir $D > $D/log 2>&1 &
sleep 1
C="redis-cli -p 7311"
python3 - <<'PY'
import socket
s=socket.create_connection(("127.0.0.1",7311))
buf=b""
n=0
for i in range(0,600000,1000):
    cmds=b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$8\r\nvvvvvvvv\r\n"%(len(k),k) for k in (b"k%d"%j for j in range(i,i+1000)))
    s.sendall(cmds)
    got=0
    while got<1000:
        d=s.recv(65536); got+=d.count(b"\r\n")
PY
$C info memory | grep -E "used_memory:|mango_heap" 
$C info | grep -i "mango_heap_\(alloc\|carv\|reclaim\)"
$C flushall; sleep 3
$C info memory | grep -E "used_memory:|mango_heap"
for i in $(seq 1 80); do r=$(head -c 1000000 /dev/zero | tr "\0" "x" | $C -x set big$i); [ "$r" = OK ] || { echo "big$i: $r"; break; }; [ $i -gt 48 ] && $C info | grep -i "mango_heap_\(alloc\|carv\|reclaim\)" | tr "\r\n" "  "; echo; done
$C dbsize; $C info | grep -i "mango_heap_\(alloc\|carv\|reclaim\)"
$C info memory | grep -E "used_memory:|mango_heap"
tail -5 $D/log
$C shutdown nosave 2>/dev/null
