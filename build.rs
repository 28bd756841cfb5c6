//! Links the `taskbox` binary as a position-dependent executable on Linux (`-no-pie`).
//!
//! A warm `taskbox run` through a server is a short process whose own start is most of what it
//! adds over the command (ARCHITECTURE.md, "The CLI's fast path"). As a PIE, the dynamic loader
//! applies ~32,000 relative relocations to every start, touching ~550 KB of relocated data
//! (about 120 of the process's ~280 page faults, and ~0.3–0.4 ms of CPU); linked at a fixed
//! address it applies none. The objects stay position-independent code: only the final link
//! of the binary changes, the library and the test binaries are linked as before. The cost is
//! that the binary's own image is not randomised (its heap, stack and shared libraries are).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bin=taskbox=-no-pie");
    }
}
