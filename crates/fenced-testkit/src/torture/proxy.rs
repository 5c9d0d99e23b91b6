//! A TCP proxy on loopback for network faults: reset every connection,
//! blackhole them (hold every byte back) and heal, or slow them (a delay
//! with jitter, and now and then a retransmission's worth more, in order,
//! as TCP over a lossy link delivers). `tc netem` does not
//! work on these machines, and a proxy per worker lets one holder be cut
//! off while the others go on.
//!
//! It runs on its own thread and runtime, so a driver blocked in a server
//! restart never stalls the traffic it carries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

/// A slow, lossy link, as TCP makes it look: every chunk `base` plus up
/// to `jitter` late, and one in `1 / loss` a retransmission (`rto`) more;
/// bytes still arrive in order.
#[derive(Clone, Copy, Debug)]
pub struct Slow {
    /// The least delay.
    pub base: Duration,
    /// Up to this much more, at random.
    pub jitter: Duration,
    /// The share of chunks that are lost once and sent again.
    pub loss: f64,
    /// What a loss costs: the retransmission timeout.
    pub rto: Duration,
}

/// One listening port that forwards to one target.
pub struct Proxy {
    port: u16,
    ctl: Arc<Ctl>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Ctl {
    blackhole: watch::Sender<bool>,
    /// Holds back only what the servers send.
    replies: watch::Sender<bool>,
    /// Never set: what the requests' side waits on beside the blackhole.
    quiet: watch::Sender<bool>,
    cut: watch::Sender<u64>,
    slow: watch::Sender<Option<Slow>>,
    stop: watch::Sender<bool>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let ctl = Arc::new(Ctl {
            blackhole: watch::channel(false).0,
            replies: watch::channel(false).0,
            quiet: watch::channel(false).0,
            cut: watch::channel(0).0,
            slow: watch::channel(None).0,
            stop: watch::channel(false).0,
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let c = ctl.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || rt.block_on(serve(listener, target, c)))?;
        Ok(Proxy {
            port,
            ctl,
            thread: Some(thread),
        })
    }

    /// The loopback port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Resets every open connection (RST both ways); new ones go through.
    pub fn cut(&self) {
        self.ctl.cut.send_modify(|g| *g += 1);
    }

    /// Holds back every byte both ways (and new connections) until healed.
    pub fn blackhole(&self, on: bool) {
        self.ctl.blackhole.send_replace(on);
    }

    /// Holds back what the server sends (requests still reach it) until
    /// called again with `false`.
    pub fn hold_replies(&self, on: bool) {
        self.ctl.replies.send_replace(on);
    }

    /// Slows every byte both ways as `slow` says, until `None`.
    pub fn slow(&self, slow: Option<Slow>) {
        self.ctl.slow.send_replace(slow);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.ctl.stop.send_replace(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(listener: std::net::TcpListener, target: SocketAddr, ctl: Arc<Ctl>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let mut stop = ctl.stop.subscribe();
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            a = listener.accept() => {
                if let Ok((client, _)) = a {
                    conns.spawn(connection(client, target, ctl.clone()));
                }
            }
            // A stop sent before this loop subscribed counts too.
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Dropping the set aborts every connection.
}

async fn connection(client: tokio::net::TcpStream, target: SocketAddr, ctl: Arc<Ctl>) {
    let mut cut = ctl.cut.subscribe();
    let mut hole = [ctl.blackhole.subscribe(), ctl.quiet.subscribe()];
    // A partition holds back the handshake too.
    if wait_open(&mut hole).await.is_err() {
        return;
    }
    let Ok(server) = tokio::net::TcpStream::connect(target).await else {
        let _ = client.set_zero_linger();
        return;
    };
    // Closing with linger 0 sends RST: a cut looks like a reset, not a
    // polite close.
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        let _ = s.set_zero_linger();
    }
    cut.borrow_and_update();
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // The server's side also stops while replies are held.
    let both = |c: &Ctl| [c.blackhole.subscribe(), c.replies.subscribe()];
    let slow = || ctl.slow.subscribe();
    tokio::select! {
        _ = pump(cr, sw, [ctl.blackhole.subscribe(), ctl.quiet.subscribe()], slow()) => {}
        _ = pump(sr, cw, both(&ctl), slow()) => {}
        _ = cut.changed() => {}
    }
}

/// Waits until none of `holes` holds bytes back.
async fn wait_open(holes: &mut [watch::Receiver<bool>; 2]) -> Result<(), watch::error::RecvError> {
    loop {
        let [a, b] = holes;
        let held = (*a.borrow_and_update(), *b.borrow_and_update());
        match held {
            (false, false) => return Ok(()),
            (true, _) => a.changed().await?,
            (_, true) => b.changed().await?,
        }
    }
}

async fn pump(
    from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    holes: [watch::Receiver<bool>; 2],
    slow: watch::Receiver<Option<Slow>>,
) {
    // The reader stamps each chunk with when it may go; the writer sends
    // them in order at those times, so a slow link still carries many
    // chunks at once.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    // The writer ends when the reader is done and every chunk it read
    // is written (bytes that came with a FIN still go), or when the peer
    // is gone, which ends the reader at its next chunk.
    let write = async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read(from, holes, slow, tx), write);
}

/// Reads chunks while the holes are open, and hands them on with the
/// time each may be sent.
async fn read(
    mut from: OwnedReadHalf,
    mut holes: [watch::Receiver<bool>; 2],
    slow: watch::Receiver<Option<Slow>>,
    to: tokio::sync::mpsc::UnboundedSender<(tokio::time::Instant, Vec<u8>)>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut last = tokio::time::Instant::now();
    loop {
        if wait_open(&mut holes).await.is_err() {
            return;
        }
        let n = {
            let [a, b] = &mut holes;
            tokio::select! {
                r = from.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                // Held back while waiting: stop reading.
                _ = a.changed() => continue,
                _ = b.changed() => continue,
            }
        };
        // Bytes read as the hole opened are held back with the rest.
        if wait_open(&mut holes).await.is_err() {
            return;
        }
        let now = tokio::time::Instant::now();
        let at = match *slow.borrow() {
            None => now,
            Some(s) => {
                let lost = fastrand::f64() < s.loss;
                let extra =
                    s.jitter.mul_f64(fastrand::f64()) + if lost { s.rto } else { Duration::ZERO };
                now + s.base + extra
            }
        };
        // In order: never before the chunk ahead of it.
        last = last.max(at);
        if to.send((last, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    fn echo_server() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming().take(8) {
                let mut s = s.unwrap();
                std::thread::spawn(move || {
                    let mut b = [0u8; 64];
                    while let Ok(n) = s.read(&mut b) {
                        if n == 0 || s.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn round_trip(s: &mut std::net::TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg)?;
        let mut b = vec![0u8; msg.len()];
        s.read_exact(&mut b)?;
        Ok(b)
    }

    #[test]
    fn forwards_holds_back_and_cuts() {
        let p = Proxy::start(echo_server()).unwrap();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", p.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert_eq!(round_trip(&mut s, b"one").unwrap(), b"one");
        // Blackholed: nothing comes back; healed: the held bytes arrive.
        p.blackhole(true);
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"two").unwrap();
        let mut b = [0u8; 3];
        assert!(
            s.read_exact(&mut b).is_err(),
            "a blackhole let bytes through"
        );
        p.blackhole(false);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"two");
        // Cut: the connection is reset; a new one works.
        p.cut();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            round_trip(&mut s, b"three").is_err(),
            "a cut connection still works"
        );
        let mut s2 = std::net::TcpStream::connect(("127.0.0.1", p.port())).unwrap();
        s2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(round_trip(&mut s2, b"four").unwrap(), b"four");
    }
    #[test]
    fn a_slow_lossy_link_delivers_every_byte_in_order() {
        let p = Proxy::start(echo_server()).unwrap();
        p.slow(Some(Slow {
            base: Duration::from_millis(1),
            jitter: Duration::from_millis(20),
            loss: 0.2,
            rto: Duration::from_millis(30),
        }));
        let mut s = std::net::TcpStream::connect(("127.0.0.1", p.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let sent: Vec<u8> = (0..200u8).collect();
        for chunk in sent.chunks(7) {
            s.write_all(chunk).unwrap();
        }
        let mut back = vec![0u8; sent.len()];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, sent);
        p.slow(None);
        assert_eq!(round_trip(&mut s, b"fast").unwrap(), b"fast");
    }
}
