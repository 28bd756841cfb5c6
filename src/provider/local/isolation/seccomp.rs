//! The seccomp filter every command of an isolated sandbox runs under: defence in depth behind
//! the namespaces, denying what no build or test needs ([`DENIED`]).
//!
//! Hand-built classic BPF rather than a crate such as `seccompiler`: the filter is a fixed deny
//! list (one comparison per system call and one test of `clone`'s flags), installed in a forked
//! child that must not allocate, so a dozen lines that build the program before the fork are all
//! it takes; a crate would add a compiler for rule sets this does not have. The filter is for
//! x86-64 (the architecture is checked first: a call through another ABI, i386 or x32, is
//! refused); elsewhere [`program`] is `None` and doctor says so.

/// The system calls a sandboxed command cannot make (they fail with `EPERM`), and why.
pub const DENIED: &[(&str, &str)] = &[
    ("kexec_load, kexec_file_load", "replace the running kernel"),
    ("bpf", "load kernel programs"),
    ("perf_event_open", "profile the kernel and other processes"),
    ("keyctl, add_key, request_key", "the kernel keyrings (not namespaced)"),
    ("ptrace, process_vm_readv, process_vm_writev", "read or steer other processes"),
    (
        "mount, umount2, pivot_root, move_mount, open_tree, fsopen, fsconfig, fsmount, fspick, mount_setattr",
        "change the sandbox's mounts",
    ),
    ("unshare, setns, clone with namespace flags (clone3: ENOSYS, so libc falls back to clone)", "make or enter other namespaces"),
    ("swapon, swapoff, reboot, acct, quotactl", "administer the machine"),
    ("init_module, finit_module, delete_module", "load kernel modules"),
    ("iopl, ioperm", "reach I/O ports"),
    ("open_by_handle_at, name_to_handle_at", "open files by handle, around the mount tree"),
    ("userfaultfd", "stall the kernel on page faults (exploit helper)"),
    ("syslog", "read the kernel log"),
    ("settimeofday, clock_settime, clock_adjtime, adjtimex", "change the machine's clock"),
];

/// x86-64 system call numbers of [`DENIED`] (besides `clone` and `clone3`).
#[cfg(target_arch = "x86_64")]
const NUMBERS: &[u32] = &[
    246, 320, // kexec_load, kexec_file_load
    321, // bpf
    298, // perf_event_open
    250, 248, 249, // keyctl, add_key, request_key
    101, 310, 311, // ptrace, process_vm_readv, process_vm_writev
    165, 166, 155, 429, 428, 430, 431, 432, 433, 442, // mount .. mount_setattr
    272, 308, // unshare, setns
    167, 168, 169, 163, 179, // swapon, swapoff, reboot, acct, quotactl
    175, 313, 176, // init_module, finit_module, delete_module
    172, 173, // iopl, ioperm
    304, 303, // open_by_handle_at, name_to_handle_at
    323, // userfaultfd
    103, // syslog
    164, 227, 305, 159, // settimeofday, clock_settime, clock_adjtime, adjtimex
];

#[cfg(target_arch = "x86_64")]
const SYS_CLONE: u32 = 56;
#[cfg(target_arch = "x86_64")]
const SYS_CLONE3: u32 = 435;
/// `AUDIT_ARCH_X86_64`.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xC000_003E;
/// The x32 ABI's bit in the system call number.
#[cfg(target_arch = "x86_64")]
const X32_BIT: u32 = 0x4000_0000;

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

/// The filter's program (`None`: no filter for this architecture), built once per process:
/// every sandbox's spawner and every helper installs the same one.
pub(super) fn filter() -> Option<&'static [libc::sock_filter]> {
    static PROGRAM: std::sync::OnceLock<Option<Vec<libc::sock_filter>>> =
        std::sync::OnceLock::new();
    PROGRAM.get_or_init(program).as_deref()
}

/// The filter's program (`None`: no filter for this architecture).
#[cfg(target_arch = "x86_64")]
fn program() -> Option<Vec<libc::sock_filter>> {
    // `struct seccomp_data`: nr at 0, arch at 4, args[0] at 16 (its low half, little-endian).
    let mut p = vec![
        stmt(BPF_LD_W_ABS, 4),
        jump(BPF_JEQ_K, ARCH, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, 0),
        jump(BPF_JGE_K, X32_BIT, 0, 1),
        stmt(BPF_RET_K, errno(libc::EPERM)),
    ];
    for &nr in NUMBERS {
        p.push(jump(BPF_JEQ_K, nr, 0, 1));
        p.push(stmt(BPF_RET_K, errno(libc::EPERM)));
    }
    p.push(jump(BPF_JEQ_K, SYS_CLONE3, 0, 1));
    p.push(stmt(BPF_RET_K, errno(libc::ENOSYS)));
    let namespaces = super::init::NAMESPACES as u32;
    p.push(jump(BPF_JEQ_K, SYS_CLONE, 0, 3));
    p.push(stmt(BPF_LD_W_ABS, 16));
    p.push(jump(BPF_JSET_K, namespaces, 0, 1));
    p.push(stmt(BPF_RET_K, errno(libc::EPERM)));
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    Some(p)
}

/// The filter's program (`None`: no filter for this architecture).
#[cfg(not(target_arch = "x86_64"))]
fn program() -> Option<Vec<libc::sock_filter>> {
    None
}
