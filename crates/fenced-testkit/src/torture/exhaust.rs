//! The exhaustion fault's hoard: idle connections of the test kit's own
//! that fill a server's connection limit, as a neighbour's leak or a
//! connection storm would, at the server's default limit (Redis
//! `maxclients`, PostgreSQL `max_connections`, MariaDB `max_connections`,
//! ZooKeeper's `maxClientCnxns` per address).
//!
//! Each connection is a real client of the engine, past its handshake,
//! so the server counts it: a bare TCP connection does not count on
//! PostgreSQL, and is dropped after ten seconds by MariaDB and ZooKeeper.
//! The ZooKeeper and Redis handshakes are a few bytes and are written
//! here; PostgreSQL's and MariaDB's, with authentication, go through sqlx.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most connections a hoard opens: far above every default limit
/// (Redis's 10,000 is the highest), so that a server with none is
/// reported rather than fed for ever.
const MOST: usize = 12_000;

/// Which engine's handshake the hoard speaks.
#[derive(Clone, Debug)]
pub(crate) enum Engine {
    Redis(SocketAddr),
    Postgres(String),
    Mariadb(String),
    ZooKeeper(SocketAddr),
}

/// One connection the server counted, kept open for its slot.
#[allow(dead_code)]
enum Held {
    Tcp(TcpStream),
    Pg(sqlx::PgConnection),
    My(sqlx::MySqlConnection),
}

/// Connections that fill a server's limit, and take each slot that
/// frees, until stopped.
pub(crate) struct Hoard {
    stop: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hoard {
    /// Opens connections until the server refuses one; `Err` if it takes
    /// [`MOST`] without refusing, or fails otherwise.
    pub(crate) fn fill(engine: Engine) -> Result<(Hoard, usize), String> {
        // Redis's limit alone is 10,000 connections: the soft limit on open
        // files (often 1,024) would stop the hoard long before, and the
        // driver's own proxies with it.
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
            && soft < hard
        {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicUsize::new(0));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (s, h) = (stop.clone(), held.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the hoard");
            rt.block_on(hoard(engine, s, h, ready_tx));
        });
        let hoard = Hoard {
            stop,
            held,
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(n)) => Ok((hoard, n)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the hoard's thread died".into()),
        }
    }

    /// How many connections it holds now.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

impl Drop for Hoard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn hoard(
    engine: Engine,
    stop: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
    ready: std::sync::mpsc::Sender<Result<usize, String>>,
) {
    let mut conns = Vec::new();
    let filled = loop {
        if conns.len() >= MOST {
            break Err(format!(
                "the server took {MOST} connections without refusing one: no limit to reach"
            ));
        }
        match open(&engine).await {
            Ok(Some(c)) => {
                conns.push(c);
                held.store(conns.len(), Ordering::Release);
            }
            Ok(None) => break Ok(conns.len()),
            Err(e) => break Err(e),
        }
    };
    let failed = filled.is_err();
    let _ = ready.send(filled);
    if failed {
        return;
    }
    // Every slot that frees (a client's connection reset, one of ours
    // closed by the server) is taken again, until the fault heals: at
    // once for the first moments, when the driver resets the workers'
    // connections and they race the hoard for their slots, then a few
    // times a second (each refused try costs the server a little:
    // PostgreSQL forks a backend for it).
    let burst_until = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut last_ping = tokio::time::Instant::now();
    while !stop.load(Ordering::Acquire) {
        match open(&engine).await {
            Ok(Some(c)) if conns.len() < MOST => conns.push(c),
            _ if tokio::time::Instant::now() < burst_until => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        if last_ping.elapsed() > Duration::from_secs(3) {
            // ZooKeeper ends a session that says nothing for its timeout;
            // a socket the server closed holds no slot and is let go.
            let zk = matches!(engine, Engine::ZooKeeper(_));
            let mut live = Vec::with_capacity(conns.len());
            for mut c in conns {
                if let Held::Tcp(s) = &mut c {
                    if zk && zk_ping(s).await.is_err() {
                        continue;
                    }
                    let mut buf = [0u8; 512];
                    if matches!(s.try_read(&mut buf), Ok(0)) {
                        continue;
                    }
                }
                live.push(c);
            }
            conns = live;
            last_ping = tokio::time::Instant::now();
        }
        held.store(conns.len(), Ordering::Release);
    }
}

/// Whether an I/O error on a connection just made says the server closed
/// it (as a full server does), rather than that this host ran out of
/// something (files, ports), which must not pass for a full server.
fn closed_by_server(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof
    )
}

/// One more connection the server counts; `None` when it refuses it for
/// its limit.
async fn open(engine: &Engine) -> Result<Option<Held>, String> {
    let within = Duration::from_secs(5);
    let answer = tokio::time::timeout(within, async {
        match engine {
            Engine::Redis(addr) => redis(*addr).await,
            Engine::ZooKeeper(addr) => zookeeper(*addr).await,
            Engine::Postgres(url) => {
                use sqlx::Connection;
                match sqlx::PgConnection::connect(url).await {
                    Ok(c) => Ok(Some(Held::Pg(c))),
                    // too_many_connections
                    Err(e) if code(&e).as_deref() == Some("53300") => Ok(None),
                    Err(e) => Err(format!("PostgreSQL: {e}")),
                }
            }
            Engine::Mariadb(url) => {
                use sqlx::Connection;
                match sqlx::MySqlConnection::connect(url).await {
                    Ok(c) => Ok(Some(Held::My(c))),
                    // ER_CON_COUNT_ERROR, "Too many connections"
                    Err(e)
                        if e.as_database_error()
                            .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
                            .is_some_and(|m| m.number() == 1040) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(format!("MariaDB: {e}")),
                }
            }
        }
    });
    answer
        .await
        .unwrap_or_else(|_| Err(format!("no answer from the server within {within:?}")))
}

fn code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// A Redis connection past `PING`; a full server answers with an error
/// and closes.
async fn redis(addr: SocketAddr) -> Result<Option<Held>, String> {
    let mut s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        // A full server may reset a connection as it is made.
        Err(e) if closed_by_server(&e) => return Ok(None),
        Err(e) => return Err(format!("Redis: {e}")),
    };
    match s.write_all(b"PING\r\n").await {
        Err(e) if closed_by_server(&e) => return Ok(None),
        Err(e) => return Err(format!("Redis: {e}")),
        Ok(()) => {}
    }
    let mut buf = [0u8; 128];
    let n = match s.read(&mut buf).await {
        Ok(n) => n,
        Err(e) if closed_by_server(&e) => 0,
        Err(e) => return Err(format!("Redis: {e}")),
    };
    let reply = String::from_utf8_lossy(&buf[..n]);
    if reply.starts_with("+PONG") {
        Ok(Some(Held::Tcp(s)))
    } else if n == 0 || reply.contains("max number of clients") {
        Ok(None)
    } else {
        Err(format!("Redis answered PING with {reply:?}"))
    }
}

/// A ZooKeeper session (a `ConnectRequest` answered): the server counts
/// connections per address at accept and closes those past its limit.
async fn zookeeper(addr: SocketAddr) -> Result<Option<Held>, String> {
    let mut s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        // A full server may reset a connection as it is made.
        Err(e) if closed_by_server(&e) => return Ok(None),
        Err(e) => return Err(format!("ZooKeeper: {e}")),
    };
    // ConnectRequest: protocol version, last zxid seen, timeout (ms),
    // session id, password (length-prefixed, 16 zero bytes), read-only.
    let mut req = Vec::new();
    req.extend_from_slice(&0i32.to_be_bytes());
    req.extend_from_slice(&0i64.to_be_bytes());
    req.extend_from_slice(&40_000i32.to_be_bytes());
    req.extend_from_slice(&0i64.to_be_bytes());
    req.extend_from_slice(&16i32.to_be_bytes());
    req.extend_from_slice(&[0u8; 16]);
    req.push(0);
    let mut framed = (req.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&req);
    // Closed at accept (a reset, a broken pipe, an end of stream): the
    // address has its fill.
    let handshake = async {
        s.write_all(&framed).await?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await?;
        let mut body = vec![0u8; i32::from_be_bytes(len).clamp(0, 1024) as usize];
        s.read_exact(&mut body).await
    };
    match handshake.await {
        Ok(_) => Ok(Some(Held::Tcp(s))),
        Err(e) if closed_by_server(&e) => Ok(None),
        Err(e) => Err(format!("ZooKeeper: {e}")),
    }
}

/// A ping on a ZooKeeper session (xid -2, op 11); its answer is left
/// unread (a few bytes per ping in the socket's buffer).
async fn zk_ping(s: &mut TcpStream) -> std::io::Result<()> {
    let mut p = 8i32.to_be_bytes().to_vec();
    p.extend_from_slice(&(-2i32).to_be_bytes());
    p.extend_from_slice(&11i32.to_be_bytes());
    s.write_all(&p).await
}
