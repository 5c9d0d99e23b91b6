// Apache Curator's recipes other than the mutex, for the interop tests:
// connects to ZooKeeper (args[0]), says "ready", then reads one command a
// line from stdin and answers each with one line:
//
//   dal-get PATH | dal-add PATH DELTA          DistributedAtomicLong
//   count-get PATH | count-set PATH N          SharedCount (seed 0)
//   count-add PATH DELTA                       SharedCount, by trySetCount
//   count-wait PATH N MS                       a SharedCount listener: "saw N" at
//                                              once, or "watching" then "saw N" or "timeout"
//   barrier-set PATH | barrier-remove PATH     DistributedBarrier
//   barrier-wait PATH MS                       "waiting", then "passed" or "timeout"
//   latch-start PATH ID                        LeaderLatch, kept by its ID
//   latch-await ID MS                          "leader" or "timeout"
//   latch-has ID                               "true" or "false"
//   latch-close ID                             "closed"
//   latch-leader PATH                          the leader's id, or "none"
//   latch-ids PATH                             the participants' ids, by sequence
//   sem-acquire PATH MAX ID MS                 InterProcessSemaphoreV2: one lease, kept
//                                              by its ID: "acquired" or "timeout"
//   sem-release ID                             "released"
//   dbarrier-enter PATH QTY ID MS              DistributedDoubleBarrier, kept by its ID:
//                                              "entered" or "timeout"
//   dbarrier-leave ID MS                       "left" or "timeout"
//   set-data PATH TEXT                         the node's data (made if missing)
//   quit
//
// An exception answers "error <message>".
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.atomic.AtomicValue;
import org.apache.curator.framework.recipes.atomic.DistributedAtomicLong;
import org.apache.curator.framework.recipes.barriers.DistributedBarrier;
import org.apache.curator.framework.recipes.barriers.DistributedDoubleBarrier;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.shared.SharedCount;
import org.apache.curator.framework.recipes.shared.SharedCountListener;
import org.apache.curator.framework.recipes.shared.SharedCountReader;
import org.apache.curator.framework.recipes.shared.VersionedValue;
import org.apache.curator.framework.state.ConnectionState;
import org.apache.curator.retry.RetryNTimes;
import org.apache.curator.retry.RetryOneTime;

public class CuratorRecipes {
    static CuratorFramework client;
    static final Map<String, LeaderLatch> latches = new HashMap<>();
    static final Map<String, Lease> leases = new HashMap<>();
    static final Map<String, DistributedDoubleBarrier> doubles = new HashMap<>();

    public static void main(String[] args) throws Exception {
        client = CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            String[] a = line.trim().split(" ");
            if (a[0].equals("quit")) {
                break;
            }
            try {
                say(run(a));
            } catch (Exception e) {
                say("error " + e);
            }
        }
        for (LeaderLatch l : latches.values()) {
            l.close();
        }
        for (Lease l : leases.values()) {
            l.close();
        }
        client.close();
    }

    static void say(String s) {
        System.out.println(s);
        System.out.flush();
    }

    static String run(String[] a) throws Exception {
        switch (a[0]) {
            case "dal-get": {
                AtomicValue<Long> v = dal(a[1]).get();
                return v.succeeded() ? v.postValue().toString() : "failed";
            }
            case "dal-add": {
                AtomicValue<Long> v = dal(a[1]).add(Long.parseLong(a[2]));
                return v.succeeded() ? v.postValue().toString() : "failed";
            }
            case "count-get": {
                try (SharedCount c = count(a[1])) {
                    return Integer.toString(c.getCount());
                }
            }
            case "count-set": {
                try (SharedCount c = count(a[1])) {
                    c.setCount(Integer.parseInt(a[2]));
                    return "ok";
                }
            }
            case "count-add": {
                try (SharedCount c = count(a[1])) {
                    for (int i = 0; i < 1000; i++) {
                        VersionedValue<Integer> v = c.getVersionedValue();
                        int next = v.getValue() + Integer.parseInt(a[2]);
                        if (c.trySetCount(v, next)) {
                            return Integer.toString(next);
                        }
                    }
                    return "failed";
                }
            }
            case "count-wait": {
                int want = Integer.parseInt(a[2]);
                CountDownLatch saw = new CountDownLatch(1);
                try (SharedCount c = count(a[1])) {
                    c.addListener(new SharedCountListener() {
                        public void countHasChanged(SharedCountReader r, int n) {
                            if (n == want) {
                                saw.countDown();
                            }
                        }

                        public void stateChanged(CuratorFramework f, ConnectionState s) {}
                    });
                    if (c.getCount() == want) {
                        return "saw " + want;
                    }
                    say("watching");
                    return saw.await(Long.parseLong(a[3]), TimeUnit.MILLISECONDS)
                            ? "saw " + want
                            : "timeout";
                }
            }
            case "barrier-set":
                new DistributedBarrier(client, a[1]).setBarrier();
                return "ok";
            case "barrier-remove":
                new DistributedBarrier(client, a[1]).removeBarrier();
                return "ok";
            case "barrier-wait": {
                DistributedBarrier b = new DistributedBarrier(client, a[1]);
                say("waiting");
                return b.waitOnBarrier(Long.parseLong(a[2]), TimeUnit.MILLISECONDS)
                        ? "passed"
                        : "timeout";
            }
            case "latch-start": {
                LeaderLatch l = new LeaderLatch(client, a[1], a[2]);
                l.start();
                latches.put(a[2], l);
                return "started";
            }
            case "latch-await":
                return latches.get(a[1]).await(Long.parseLong(a[2]), TimeUnit.MILLISECONDS)
                        ? "leader"
                        : "timeout";
            case "latch-has":
                return Boolean.toString(latches.get(a[1]).hasLeadership());
            case "latch-close":
                latches.remove(a[1]).close();
                return "closed";
            case "latch-leader": {
                Participant p = new LeaderLatch(client, a[1]).getLeader();
                return p.isLeader() ? p.getId() : "none";
            }
            case "latch-ids": {
                StringBuilder ids = new StringBuilder();
                for (Participant p : new LeaderLatch(client, a[1]).getParticipants()) {
                    ids.append(ids.length() == 0 ? "" : ",").append(p.getId());
                }
                return ids.toString();
            }
            case "sem-acquire": {
                InterProcessSemaphoreV2 s =
                        new InterProcessSemaphoreV2(client, a[1], Integer.parseInt(a[2]));
                Lease l = s.acquire(Long.parseLong(a[4]), TimeUnit.MILLISECONDS);
                if (l == null) {
                    return "timeout";
                }
                leases.put(a[3], l);
                return "acquired";
            }
            case "sem-release":
                leases.remove(a[1]).close();
                return "released";
            case "dbarrier-enter": {
                DistributedDoubleBarrier b =
                        new DistributedDoubleBarrier(client, a[1], Integer.parseInt(a[2]));
                doubles.put(a[3], b);
                return b.enter(Long.parseLong(a[4]), TimeUnit.MILLISECONDS) ? "entered" : "timeout";
            }
            case "dbarrier-leave":
                return doubles.get(a[1]).leave(Long.parseLong(a[2]), TimeUnit.MILLISECONDS)
                        ? "left"
                        : "timeout";
            case "set-data":
                if (client.checkExists().forPath(a[1]) == null) {
                    client.create().creatingParentContainersIfNeeded().forPath(a[1], a[2].getBytes());
                } else {
                    client.setData().forPath(a[1], a[2].getBytes());
                }
                return "ok";
            default:
                return "error unknown command " + a[0];
        }
    }

    static DistributedAtomicLong dal(String path) {
        return new DistributedAtomicLong(client, path, new RetryNTimes(1000, 1));
    }

    static SharedCount count(String path) throws Exception {
        SharedCount c = new SharedCount(client, path, 0);
        c.start();
        return c;
    }
}
