"""redis-py's own Lock, driven by the interop tests (tests/redis.rs).

usage: redis_py_lock.py PORT NAME try
       redis_py_lock.py PORT NAME hold SECONDS     (prints "held", then holds)
       redis_py_lock.py PORT NAME loop ROUNDS FILE (increments FILE under the lock)
"""
import sys
import time

import redis

port, name, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3]
r = redis.Redis(host="127.0.0.1", port=port)

if cmd == "try":
    lock = r.lock(name, timeout=10)
    if lock.acquire(blocking=False):
        print("acquired", flush=True)
        lock.release()
    else:
        print("busy", flush=True)
elif cmd == "hold":
    lock = r.lock(name, timeout=30)
    assert lock.acquire(blocking=True, blocking_timeout=30)
    print("held", flush=True)
    time.sleep(float(sys.argv[4]))
    lock.release()
elif cmd == "loop":
    rounds, path = int(sys.argv[4]), sys.argv[5]
    for _ in range(rounds):
        with r.lock(name, timeout=10, blocking_timeout=60, sleep=0.01):
            with open(path) as f:
                n = int(f.read().strip() or "0")
            time.sleep(0.002)
            with open(path, "w") as f:
                f.write(str(n + 1))
else:
    sys.exit("unknown command " + cmd)
