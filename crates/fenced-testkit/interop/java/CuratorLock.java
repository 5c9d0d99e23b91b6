// Apache Curator's InterProcessMutex, for the interop test: connects to
// ZooKeeper (args[0]), says "waiting", acquires args[1], says "acquired",
// holds it args[2] ms, releases, says "released".
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorLock {
    public static void main(String[] args) throws Exception {
        CuratorFramework client =
                CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        System.out.println("waiting");
        System.out.flush();
        mutex.acquire();
        System.out.println("acquired");
        System.out.flush();
        Thread.sleep(Long.parseLong(args[2]));
        mutex.release();
        System.out.println("released");
        System.out.flush();
        client.close();
    }
}
