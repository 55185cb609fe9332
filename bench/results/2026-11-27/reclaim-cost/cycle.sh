#!/bin/bash
# cycle.sh [REDIS_DURABLE]: 500 000 small SETs, FLUSHALL, 1 MB SETs until one
# is refused, FLUSHALL, the small SETs again; heap figures from INFO after
# each step (docs/redis.md, "Reclaiming what small keys leave behind").
set -u
D=/tmp/strand2; rm -rf $D; mkdir -p $D
B=${1:-build/redis-work/redis-server-durable}
$B --port 7314 --save '' --appendonly no --mango-pool $D/p.pool --mango-mode emulated --mango-pool-size 128m --dir $D > $D/log 2>&1 &
sleep 1
C="redis-cli -p 7314"
fill() { python3 - "$1" <<'PY'
import socket,sys
pre=sys.argv[1].encode()
s=socket.create_connection(("127.0.0.1",7314))
for i in range(0,500000,1000):
    s.sendall(b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$8\r\nvvvvvvvv\r\n"%(len(k),k) for k in (pre+b"%d"%j for j in range(i,i+1000))))
    got=0
    while got<1000:
        d=s.recv(65536); got+=d.count(b"\r\n")
PY
}
stats() { echo "$1: $($C dbsize) keys; $($C info | grep -E 'mango_heap_(allocated|carved|reclaims)' | tr '\r\n' '  ')"; }
fill k; stats "500k small keys"
$C flushall >/dev/null; sleep 3
n=0; for i in $(seq 1 80); do r=$(head -c 1000000 /dev/zero | tr "\0" "x" | $C -x set big$i); [ "$r" = OK ] || break; n=$i; done
stats "$n 1 MB values"
$C flushall >/dev/null; sleep 3
fill j; stats "500k small keys again"
$C shutdown nosave >/dev/null 2>&1
