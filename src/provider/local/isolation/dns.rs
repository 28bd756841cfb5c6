//! DNS for a sandbox with `terminal.local_network = isolated` whose host resolver listens on the
//! host's loopback (systemd-resolved's `127.0.0.53`, a local dnsmasq or unbound on
//! `127.0.0.1`), which the sandbox has no route to by design.
//!
//! **Why not `pasta --dns-forward`.** `pasta` forwards queries sent to a chosen address to the
//! first nameserver it keeps from the host's `/etc/resolv.conf` — but with `--no-map-gw`, which
//! the isolation needs (no route to the host's loopback), the `pasta` of Debian 12 (passt
//! 2023-03-09) drops every loopback nameserver, given with `--dns` or read from the file, so
//! queries had nowhere to go; later versions add `--dns-host` for that, not found everywhere.
//!
//! **What instead.** A relay of the server's own, for UDP only: as the sandbox's init starts
//! (in its namespaces, with the rights it has there) it binds a UDP socket to the resolver's
//! own address and port 53 on the sandbox's loopback (`127.0.0.0/8` is the sandbox's own, so the
//! host's `resolv.conf` stays true inside unchanged) and hands it to the server over a socket
//! pair (`SCM_RIGHTS`). Once `pasta` is attached, a thread of the server ([`Relay`]) carries
//! each datagram that arrives there to the host's resolver from a socket of its own, in the
//! host's network namespace, and the answer back. Nothing else of the host's loopback is
//! reachable: the relay speaks only to the one resolver, only from the one socket inside.
//! DNS over TCP (answers too long for UDP) is not relayed: such a lookup fails.
//!
//! **The sandbox's `resolv.conf`** is the host's (`terminal.local_resolv_conf`, default
//! `/etc/resolv.conf`), bound read-only over the path the sandbox's `/etc/resolv.conf` names —
//! where that is a symlink into `/run` (systemd-resolved's `stub-resolv.conf`, NetworkManager's),
//! which the sandbox does not otherwise see, the same path is made in the sandbox's root.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The port a resolver listens on.
pub const PORT: u16 = 53;

/// How long the relay waits for the host's resolver to answer one query (a resolver's client
/// retries on its own).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Queries in flight at once per sandbox; more are dropped (the client retries).
const IN_FLIGHT: usize = 64;

/// What a sandbox's DNS needs from its start: the `resolv.conf` to show it, where to show it,
/// and the loopback resolver to relay to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Dns {
    /// The host file bound over the path inside (`None`: the sandbox sees the host's as it
    /// is).
    pub(super) bind: Option<(PathBuf, PathBuf)>,
    /// The first nameserver of the file on the host's loopback, relayed (see [`Relay`]).
    pub(super) relay_to: Option<Ipv4Addr>,
}

/// The sandbox's DNS from the resolver configuration `source` (`terminal.local_resolv_conf`):
/// `None` where it cannot be read (the sandbox then sees the host's `/etc` as it is).
pub(super) fn plan(source: &Path) -> Option<Dns> {
    let text = std::fs::read_to_string(source).ok()?;
    let source = std::fs::canonicalize(source).ok()?;
    let etc = Path::new("/etc/resolv.conf");
    let linked = std::fs::symlink_metadata(etc).is_ok_and(|m| m.file_type().is_symlink());
    // What the sandbox's /etc/resolv.conf leads to (the host's /etc is bound as it is).
    let inside = if linked {
        std::fs::canonicalize(etc).ok()
    } else {
        Some(etc.to_path_buf())
    };
    // The plan leaves out a bind of a file over itself where the sandbox sees it anyway.
    let bind = inside.and_then(|inside| (source != inside || linked).then_some((source, inside)));
    Some(Dns {
        bind,
        relay_to: loopback_nameserver(&text),
    })
}

/// The first `nameserver` of a `resolv.conf` text that is an IPv4 address on the loopback.
pub(super) fn loopback_nameserver(text: &str) -> Option<Ipv4Addr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
        })
        .filter_map(|addr| addr.parse::<Ipv4Addr>().ok())
        .find(Ipv4Addr::is_loopback)
}

/// Receives the descriptor the init sent over `channel` (non-blocking: `None` when it sent
/// none).
pub(super) fn receive_fd(channel: RawFd) -> Option<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one descriptor's control message, aligned for `cmsghdr`.
    let mut control = [0u64; 4];
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: `msg` describes buffers of ours.
    let n = unsafe {
        libc::recvmsg(
            channel,
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n <= 0 {
        return None;
    }
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR and CMSG_DATA stay inside `control`.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd))
    }
}

/// Sends `fd` over the Unix socket `channel`, in the init's child: no allocation.
///
/// # Safety
/// Async-signal-safe; `channel` and `fd` are open descriptors.
pub(super) unsafe fn send_fd(channel: RawFd, fd: RawFd) -> bool {
    // SAFETY: (the whole body) buffers on this stack, described to sendmsg.
    unsafe {
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = [0u64; 4];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return false;
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
        libc::sendmsg(channel, &msg, libc::MSG_NOSIGNAL) == 1
    }
}

/// A `sockaddr_in` for `addr:port`, prepared before the clone.
pub(super) fn sockaddr(addr: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// The relay of one sandbox's DNS queries to the host's loopback resolver, on a thread of its
/// own; it ends when the sandbox does ([`Relay::end`], or the drop of its `Init`).
pub struct Relay {
    /// The write end of a pipe the thread polls: closing it ends the thread.
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").finish_non_exhaustive()
    }
}

impl Relay {
    /// Relays what arrives at `inside` (a UDP socket of the sandbox's network namespace) to
    /// `upstream` in this process's, and each answer back to whoever asked.
    pub(super) fn start(inside: OwnedFd, upstream: SocketAddrV4) -> io::Result<Relay> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two descriptors for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both are open descriptors nothing else owns.
        let (stop_r, stop_w) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let inside = UdpSocket::from(inside);
        inside.set_nonblocking(true)?;
        let thread = std::thread::Builder::new()
            .name("taskbox-dns".into())
            .spawn(move || relay(&inside, upstream, &stop_r))?;
        Ok(Relay {
            stop: Some(stop_w),
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it (its sockets close with it).
    pub(super) fn end(mut self) {
        self.stop = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Closing the pipe ends the thread; not waited for here.
        self.stop = None;
    }
}

/// A query sent on to the host's resolver, waiting for its answer.
struct Pending {
    socket: UdpSocket,
    client: std::net::SocketAddr,
    until: Instant,
}

/// The relay's loop: until `stop` closes.
fn relay(inside: &UdpSocket, upstream: SocketAddrV4, stop: &OwnedFd) {
    let mut pending: Vec<Pending> = Vec::new();
    let mut buf = vec![0u8; 65_536];
    loop {
        let now = Instant::now();
        pending.retain(|p| p.until > now);
        let wait = pending
            .iter()
            .map(|p| p.until.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(60));
        let mut polled: Vec<libc::pollfd> = [stop.as_raw_fd(), inside.as_raw_fd()]
            .into_iter()
            .chain(pending.iter().map(|p| p.socket.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let timeout = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
        // SAFETY: `polled` is a valid array of pollfds of its length.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, timeout) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!(error = %io::Error::last_os_error(), "the sandbox's DNS relay stopped");
            return;
        }
        if polled[0].revents != 0 {
            return;
        }
        // Answers first (their slots go), then new queries.
        let mut answered = Vec::new();
        for (i, p) in pending.iter().enumerate() {
            if polled[i + 2].revents == 0 {
                continue;
            }
            if let Ok(len) = p.socket.recv(&mut buf) {
                let _ = inside.send_to(&buf[..len], p.client);
            }
            answered.push(i);
        }
        for i in answered.into_iter().rev() {
            pending.swap_remove(i);
        }
        if polled[1].revents != 0 {
            while let Ok((len, client)) = inside.recv_from(&mut buf) {
                if pending.len() >= IN_FLIGHT {
                    continue;
                }
                let sent = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|socket| {
                    socket.connect(upstream)?;
                    socket.set_nonblocking(true)?;
                    socket.send(&buf[..len])?;
                    Ok(socket)
                });
                match sent {
                    Ok(socket) => pending.push(Pending {
                        socket,
                        client,
                        until: Instant::now() + ANSWER_WITHIN,
                    }),
                    Err(e) => {
                        tracing::debug!(error = %e, %upstream, "cannot relay a DNS query")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_loopback_nameserver_is_relayed_and_others_are_not() {
        let text = "# generated\nsearch example.org\nnameserver 10.0.0.1\n\
                    nameserver 127.0.0.53\nnameserver 127.0.0.1\noptions edns0\n";
        assert_eq!(
            loopback_nameserver(text),
            Some(Ipv4Addr::new(127, 0, 0, 53))
        );
        assert_eq!(loopback_nameserver("nameserver 10.255.255.53\n"), None);
        assert_eq!(loopback_nameserver("nameserver ::1\n"), None);
        assert_eq!(loopback_nameserver("#nameserver 127.0.0.1\n"), None);
        assert_eq!(loopback_nameserver(""), None);
    }

    #[test]
    fn a_relay_carries_a_query_to_its_upstream_and_the_answer_back_then_ends() {
        let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
        let up_addr = match upstream.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            std::net::SocketAddr::V6(_) => unreachable!("bound to IPv4"),
        };
        let inside = UdpSocket::bind("127.0.0.1:0").unwrap();
        let inside_addr = inside.local_addr().unwrap();
        let relay = Relay::start(OwnedFd::from(inside), up_addr).unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        upstream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        client.send_to(b"query", inside_addr).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = upstream.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"query");
        upstream.send_to(b"answer", from).unwrap();
        let (n, _) = client.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"answer");
        relay.end();
        // Its socket is closed: nothing listens there any more.
        assert!(UdpSocket::bind(inside_addr).is_ok());
    }
}
