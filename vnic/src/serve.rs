//! `vnic serve`: the daemon's main loop. The main thread accepts vhost-user
//! connections (one fresh `VhostUserDaemon` per connection, the listener is
//! kept so QEMU can reconnect); the management thread runs an
//! `event-manager` loop for the control socket (`ctlsock.rs`), the
//! programming-latency timer, the enabled-queues poll and SIGINT/SIGTERM.

use std::io::{Read, Write};
use std::os::fd::RawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::timerfd::TimerFd;

use crate::backend::VnicBackend;
use crate::config::{Config, PeerKind};
use crate::conn::Conn;
use crate::ctl;
use crate::ctlsock::CtlSocket;
use crate::daemon::Shared;
use crate::error::Error;
use crate::stats::Refusal;

const D_LISTEN: u32 = 1;
const D_SIGNAL: u32 = 2;
const D_MGMT_TIMER: u32 = 3;
const D_POLL: u32 = 4;
// The control clients' are `ctlsock::FIRST_CLIENT` and up.

/// Whether two paths name the same file (by their parent directory's
/// canonical form and the file name; the files need not exist).
fn same_path(a: &std::path::Path, b: &std::path::Path) -> bool {
    let canon = |p: &std::path::Path| {
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::canonicalize(&parent)
            .unwrap_or(parent)
            .join(p.file_name().unwrap_or_default())
    };
    canon(a) == canon(b)
}

/// Binds a listening unix socket at `path`, mode 0600 whatever the umask
/// (0660 and owned by `group` when one is given).
/// An existing socket nobody answers on (a daemon that died) is replaced;
/// one a live process answers on, or a path that is not a socket, is
/// refused with the reason.
fn claim_socket(
    what: &'static str,
    path: &std::path::Path,
    group: Option<u32>,
) -> Result<UnixListener, Error> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let in_use = |why: String| Error::SocketInUse {
        what,
        path: path.to_path_buf(),
        why,
    };
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(in_use(format!(
                "exists and is not a socket ({}); refusing to replace it",
                if m.is_dir() {
                    "a directory"
                } else {
                    "a file or other"
                }
            )));
        }
        match UnixStream::connect(path) {
            Ok(_) => {
                return Err(in_use(
                    "a live process is listening on it (another vnic serve?)".into(),
                ))
            }
            // Nobody listens: a stale socket of a daemon that died.
            Err(_) => std::fs::remove_file(path).map_err(Error::socket(what, path))?,
        }
    }
    // SAFETY: umask(2) has no memory-safety preconditions; the mask is put
    // back right after the bind (owner-only while the socket is created, so
    // it is never reachable by others).
    let old = unsafe { libc::umask(0o177) };
    let r = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let l = r.map_err(Error::socket(what, path))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(Error::socket(what, path))?;
    }
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(Error::socket(what, path))?;
    Ok(l)
}

/// Runs the daemon until a signal ends the process.
pub(crate) fn run(cfg: Config) -> Result<(), Error> {
    let sh = Shared::build(cfg)?;
    let sock = sh.cfg.socket.clone();
    // The public socket is ours; the vhost-user handler listens on a private
    // one and every connection is relayed (see relay.rs for why).
    let ctl_path = sh.cfg.ctl.clone();
    if same_path(&sock, &ctl_path) {
        return Err(Error::SocketInUse {
            what: "--ctl",
            path: ctl_path,
            why: "is the --socket path; give the control socket its own path".into(),
        });
    }
    let public = claim_socket("--socket", &sock, sh.cfg.group)?;
    let listener = claim_socket("--ctl", &ctl_path, sh.cfg.group)?;
    listener
        .set_nonblocking(true)
        .map_err(Error::socket("--ctl", &ctl_path))?;
    let (sig_r, sig_w) = UnixStream::pair().map_err(Error::io("signal pipe"))?;
    sig_r
        .set_nonblocking(true)
        .map_err(Error::io("signal pipe"))?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let w = sig_w.try_clone().map_err(Error::io("signal pipe"))?;
        signal_hook::low_level::pipe::register(sig, w).map_err(Error::io("signal handler"))?;
    }
    let mut poll = crate::clock::timer().map_err(Error::Timer)?;
    poll.reset(Duration::from_millis(50), Some(Duration::from_millis(50)))
        .map_err(|e| Error::Timer(std::io::Error::from_raw_os_error(e.errno())))?;
    let mgmt_timer = sh.lock_mgmt().timer_fd();
    let sub = Arc::new(Mutex::new(MgmtLoop {
        sh: sh.clone(),
        ctl: CtlSocket::new(sh.clone(), listener),
        sig: sig_r,
        poll,
        mgmt_timer,
    }));
    let mut em = EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new()
        .map_err(|e| Error::EventManager(format!("{e:?}")))?;
    em.add_subscriber(sub);
    std::thread::Builder::new()
        .name("vnic-mgmt".into())
        .spawn(move || loop {
            if let Err(e) = em.run() {
                log::error!("management loop: {e:?}");
                std::thread::sleep(Duration::from_millis(10));
            }
        })
        .map_err(Error::io("management thread"))?;

    eprintln!(
        "vnic: serving {} queue pair(s) on {} (peer {}, control {}, generation {:#x})",
        sh.cfg.queues,
        sock.display(),
        match &sh.cfg.peer {
            PeerKind::Gen => format!(
                "gen {} / {}",
                sh.cfg.gen_ip,
                crate::config::fmt_mac(sh.cfg.gen_mac)
            ),
            PeerKind::Tap(n) => format!("tap:{n}"),
        },
        ctl_path.display(),
        sh.generation()
    );
    loop {
        if let Err(e) = serve_one(&sh, &public) {
            log::error!("{e}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The private socket directory of the connection being set up (removed
/// as soon as the handler has accepted, or on exit).
static PRIVATE_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// A fresh 0700 directory for the private vhost-user socket.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = base.join(format!("vnic-{}-{t:08x}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Hands `frontend` to `daemon` through a relay: the handler accepts on a
/// private socket that exists only while the connection is being set up.
fn attach(
    daemon: &mut VhostUserDaemon<Arc<VnicBackend>>,
    frontend: UnixStream,
    on_enable: crate::relay::EnableHook,
    on_refuse: crate::relay::RefuseHook,
) -> Result<[std::thread::JoinHandle<()>; 2], Error> {
    let dir = private_dir().map_err(Error::io("private socket directory"))?;
    *PRIVATE_DIR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(dir.clone());
    let path = dir.join("vhost-user.sock");
    let r = (|| {
        let mut vl = Listener::new(&path, true)
            .map_err(|e| Error::VhostUser(format!("private socket {}: {e}", path.display())))?;
        let inner = UnixStream::connect(&path).map_err(Error::socket("connect", &path))?;
        daemon
            .start(&mut vl)
            .map_err(|e| Error::VhostUser(format!("accept (private): {e}")))?;
        crate::relay::start(frontend, inner, on_enable, on_refuse).map_err(Error::io("relay"))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    *PRIVATE_DIR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    r
}

fn serve_one(sh: &Arc<Shared>, public: &UnixListener) -> Result<(), Error> {
    let conn = Arc::new(Conn::new(sh.pairs()).map_err(Error::io("connection state"))?);
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let backend = Arc::new(VnicBackend::new(sh, &conn, &mem).map_err(Error::io("backend"))?);
    let mut daemon = VhostUserDaemon::new("vnic".into(), backend.clone(), mem)
        .map_err(|e| Error::VhostUser(format!("daemon: {e}")))?;
    let handlers = daemon.get_epoll_handlers();
    backend
        .register(&handlers)
        .map_err(Error::io("register worker fds"))?;
    // Install the connection state (its one owner: the management state)
    // and move to a new generation (empty table, no session) before
    // accepting: from its first message on, the frontend meets a fresh
    // device, with no window where frames could reach the previous
    // connection's state.
    let n = sh.connections.load(Ordering::Relaxed) + 1;
    sh.lock_mgmt().reset(
        Some(conn.clone()),
        if n == 1 { "connect" } else { "reconnect" },
    );
    let (frontend, _) = public.accept().map_err(Error::io("accept"))?;
    // The relay tells the enabled-pairs owner about every SET_VRING_ENABLE.
    let pairs = conn.pairs.clone();
    let sh2 = sh.clone();
    let relay = attach(
        &mut daemon,
        frontend,
        Box::new(move |index, enable| pairs.frontend_enable(index, enable)),
        Box::new(move |r, why| {
            refused(
                &sh2,
                match r {
                    crate::relay::Refused::TooBig => Refusal::TooBig,
                    crate::relay::Refused::TooManyFds => Refusal::TooManyFds,
                    crate::relay::Refused::Truncated => Refusal::Truncated,
                    crate::relay::Refused::RegionPastEof => Refusal::RegionPastEof,
                },
                why,
            );
        }),
    )?;
    sh.connections.fetch_add(1, Ordering::Relaxed);
    sh.connected.store(true, Ordering::Relaxed);
    log::info!("frontend connected (connection {n})");
    let r = daemon.wait();
    for t in relay {
        let _ = t.join();
    }
    sh.connected.store(false, Ordering::Relaxed);
    for h in &handlers {
        h.send_exit_event();
    }
    // vhost-user-backend leaks each worker's exit-event fd (see
    // VnicBackend::exit_fds): close them once the worker threads are gone,
    // i.e. once only our handles to their handlers are left.
    drop(daemon);
    let deadline = Instant::now() + Duration::from_secs(5);
    while handlers.iter().any(|h| Arc::strong_count(h) > 1) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if handlers.iter().all(|h| Arc::strong_count(h) == 1) {
        drop(handlers);
        backend.close_exit_fds();
    } else {
        log::warn!("worker threads still running 5 s after the connection ended; their exit events stay open");
    }
    // No current connection for the control socket, the poll and the
    // management path alike (the table's hit counters stay until the next
    // reset, so the evictions of that reset still report their hits).
    sh.lock_mgmt().disconnect();
    match r {
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(
            vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
        )) => {
            log::info!("frontend disconnected");
        }
        Err(e) => refused(sh, refusal_of(&e), &e.to_string()),
    }
    Ok(())
}

/// The reason counted for the error that ended a connection.
fn refusal_of(e: &vhost_user_backend::Error) -> Refusal {
    use vhost::vhost_user::Error as V;
    match e {
        vhost_user_backend::Error::HandleRequest(v) => match v {
            V::InvalidMessage | V::OversizedMsg | V::PartialMessage => Refusal::InvalidMessage,
            V::InvalidParam => Refusal::InvalidParam,
            V::IncorrectFds => Refusal::BadFds,
            V::InactiveFeature(_) | V::InactiveOperation(_) | V::FeatureMismatch => {
                Refusal::NotNegotiated
            }
            V::InvalidOperation(_) => Refusal::InvalidOperation,
            V::ReqHandlerError(_) | V::BackendInternalError => Refusal::BackendFailed,
            _ => Refusal::Other,
        },
        _ => Refusal::Other,
    }
}

/// Refusal log lines: at most one a second over all connections (a
/// hostile frontend can reconnect and be refused thousands of times a
/// second); the next line says how many it did not show.
#[derive(Debug, Default)]
struct LogLimit {
    last: Option<Instant>,
    quiet: u64,
}

impl LogLimit {
    /// Whether a line may go out at `now`; if so, how many were held back
    /// since the last one.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        {
            self.quiet += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.quiet))
    }
}

static REFUSAL_LOG: Mutex<LogLimit> = Mutex::new(LogLimit {
    last: None,
    quiet: 0,
});

/// Counts a refused vhost-user request (its connection is closed) and
/// logs it, at most one line a second.
fn refused(sh: &Shared, r: Refusal, why: &str) {
    sh.stats.vhost.count(r);
    let admitted = REFUSAL_LOG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .admit(Instant::now());
    if let Some(quiet) = admitted {
        let more = if quiet > 0 {
            format!(" ({quiet} more refused since the last line: ctl stats vhost.refused)")
        } else {
            String::new()
        };
        log::warn!(
            "vhost-user request refused ({}), connection closed: {why}{more}",
            r.name()
        );
    }
}

struct MgmtLoop {
    sh: Arc<Shared>,
    ctl: CtlSocket,
    sig: UnixStream,
    poll: TimerFd,
    mgmt_timer: RawFd,
}

impl MgmtLoop {
    fn on_signal(&mut self) -> ! {
        let mut b = [0u8; 16];
        let _ = self.sig.read(&mut b);
        let sh = &self.sh;
        let flushed = sh.tracer.flush(Duration::from_secs(5));
        if let Some(d) = PRIVATE_DIR
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = std::fs::remove_dir_all(d);
        }
        let _ = std::fs::remove_file(&sh.cfg.socket);
        let _ = std::fs::remove_file(&sh.cfg.ctl);
        print_summary(sh, flushed);
        std::process::exit(0);
    }
}

impl MutEventSubscriber for MgmtLoop {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            D_LISTEN => self.ctl.accept(ops),
            D_SIGNAL => self.on_signal(),
            D_MGMT_TIMER => self.sh.lock_mgmt().on_timer(),
            D_POLL => {
                let _ = self.poll.wait();
                if let Some(c) = self.sh.current_conn() {
                    c.poll();
                    if self.sh.cfg.preload.filters > 0 {
                        self.sh.lock_mgmt().preload_if_ready();
                    }
                }
                self.ctl.drop_stalled(ops);
            }
            d => self.ctl.serve(d, ops),
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::with_data(
            self.ctl.listener(),
            D_LISTEN,
            EventSet::IN,
        ));
        let _ = ops.add(Events::with_data(&self.sig, D_SIGNAL, EventSet::IN));
        let _ = ops.add(Events::with_data_raw(
            self.mgmt_timer,
            D_MGMT_TIMER,
            EventSet::IN,
        ));
        let _ = ops.add(Events::with_data(&self.poll, D_POLL, EventSet::IN));
    }
}

/// The exit summary (stderr).
pub(crate) fn print_summary(sh: &Shared, trace_flushed: bool) {
    let s = ctl::stats(sh);
    let mut e = std::io::stderr().lock();
    let _ = writeln!(
        e,
        "vnic: exiting after {:.1} s, generation {:#x}, {} connection(s)",
        sh.start.elapsed().as_secs_f64(),
        sh.generation(),
        s.connections
    );
    let _ = writeln!(e, "  pair   rx_pkts    rx_bytes  rx_drops  rx_filter     rx_rss   tx_pkts    tx_bytes  bad_rx  bad_tx");
    for q in &s.queues {
        let _ = writeln!(
            e,
            "  {:>4} {:>9} {:>11} {:>9} {:>10} {:>10} {:>9} {:>11} {:>7} {:>7}",
            q.index,
            q.rx_packets,
            q.rx_bytes,
            q.rx_drops,
            q.rx_filter,
            q.rx_rss,
            q.tx_packets,
            q.tx_bytes,
            q.rx_bad_chains,
            q.tx_bad_chains
        );
    }
    for q in &s.queues {
        for (dir, stopped) in [("rx", &q.rx_stopped), ("tx", &q.tx_stopped)] {
            if let Some(why) = stopped {
                let _ = writeln!(e, "  pair {}: {dir} ring stopped ({why})", q.index);
            }
        }
    }
    let m = &s.mgmt;
    let _ = writeln!(
        e,
        "  mgmt: {} frames, {} ok, {} bad, {} acks, {} caps, {} naks, {} lost (knob), {} out of order, {} duplicates",
        m.frames_rx, m.frames_ok, m.frames_bad_total, m.acks_sent, m.caps_sent, m.naks_sent, m.dropped_by_loss, m.out_of_order, m.duplicates
    );
    let t = &s.table;
    let _ = writeln!(
        e,
        "  table: {} live of {}, {} adds, {} replaces, {} resets",
        t.live, t.capacity, t.adds, t.replaces, t.resets
    );
    let tr = &s.trace;
    let _ = writeln!(
        e,
        "  trace: {} written, {} dropped{}",
        tr.written,
        tr.dropped,
        if sh.tracer.enabled() && !trace_flushed {
            " (flush timed out)"
        } else {
            ""
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_lines_are_limited_to_one_a_second() {
        let mut l = LogLimit::default();
        let t = Instant::now();
        assert_eq!(l.admit(t), Some(0));
        for ms in [1, 10, 500, 999] {
            assert_eq!(l.admit(t + Duration::from_millis(ms)), None);
        }
        assert_eq!(l.admit(t + Duration::from_secs(1)), Some(4));
        assert_eq!(l.admit(t + Duration::from_millis(1500)), None);
        assert_eq!(l.admit(t + Duration::from_secs(2)), Some(1));
    }

    #[test]
    fn handler_errors_map_to_reasons() {
        use vhost::vhost_user::Error as V;
        let h = |v| refusal_of(&vhost_user_backend::Error::HandleRequest(v));
        assert_eq!(h(V::InvalidMessage), Refusal::InvalidMessage);
        assert_eq!(h(V::InvalidParam), Refusal::InvalidParam);
        assert_eq!(h(V::IncorrectFds), Refusal::BadFds);
        assert_eq!(
            h(V::InvalidOperation("already claimed")),
            Refusal::InvalidOperation
        );
        assert_eq!(h(V::BackendInternalError), Refusal::BackendFailed);
        assert_eq!(
            h(V::SocketError(std::io::Error::other("x"))),
            Refusal::Other
        );
    }
}
