//! Links the unwinder statically (`libgcc_eh`) on Linux with glibc, so no binary of the package
//! loads `libgcc_s.so` at its start.
//!
//! Why: a warm `taskbox run` is a short process whose own start is most of what it adds over
//! the command (ARCHITECTURE.md, "The CLI's fast path"). The standard library links the
//! unwinder as `libgcc_s.so` unless the target is `crt-static`; loading it costs the dynamic
//! loader a library (open, map, relocate) and runs its constructor, whose CPUID instructions
//! exit to the hypervisor on a virtual machine: 0.90 → 0.82 ms for a Rust hello world's whole
//! run on the development VM (`perf stat -r 500`). Linked whole from the static archive (the
//! one a `crt-static` build uses), the unwinder's symbols are defined before `-lgcc_s` is
//! reached, and `--as-needed` (rustc's default) leaves it out. Panics unwind as before.

// A build script speaks to cargo on its stdout.
#![allow(clippy::print_stdout)]

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let static_crt = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" && !static_crt
    {
        println!("cargo:rustc-link-lib=static:-bundle,+whole-archive=gcc_eh");
    }
}
