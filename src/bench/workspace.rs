//! A realistic agent workspace, generated: a source tree, a `node_modules`-like tree of many small
//! files, build logs, and a few binary blobs. Snapshot speed and archive size depend on the
//! number of files and on how well their bytes compress, so the mix imitates a JavaScript
//! project: text that compresses like code (a few ×), and blobs that do not compress at all.
//!
//! Deterministic from the seed, so the archive sizes of two runs can be compared.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;

/// The shape of a generated tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeSpec {
    /// Source files (`src/**`), 1–16 KiB of code-like text each.
    pub source_files: usize,
    /// Files under `node_modules/` (packages of about a dozen files), 200 B–6 KiB each.
    pub module_files: usize,
    /// Build logs (`build/*.log`), compressible, `log_bytes` each.
    pub logs: usize,
    /// Size of each log.
    pub log_bytes: usize,
    /// Incompressible blobs (`assets/*.bin`, like images or native modules), `blob_bytes` each.
    pub blobs: usize,
    /// Size of each blob.
    pub blob_bytes: usize,
    /// Files of a Python virtualenv (`.venv/lib/python3.12/site-packages/**`: sources and
    /// byte-compiled caches, plus `bin/python` symlinks to the system's interpreter).
    #[serde(default)]
    pub venv_files: usize,
    /// Size of one large file (`data/app.db`: a database-like mix of rows and binary pages);
    /// 0 for none.
    #[serde(default)]
    pub large_bytes: usize,
}

/// The large file's path in the workspace.
pub const LARGE_FILE: &str = "data/app.db";

impl TreeSpec {
    /// About 10 MB in 1,200 files: for `--quick`.
    pub fn quick() -> TreeSpec {
        TreeSpec {
            source_files: 200,
            module_files: 800,
            logs: 1,
            log_bytes: 1 << 20,
            blobs: 2,
            blob_bytes: 1 << 20,
            venv_files: 200,
            large_bytes: 3 << 20,
        }
    }

    /// About 90 MB in 10,500 files.
    pub fn standard() -> TreeSpec {
        TreeSpec {
            source_files: 1_500,
            module_files: 8_000,
            logs: 3,
            log_bytes: 5 << 20,
            blobs: 16,
            blob_bytes: 1 << 20,
            venv_files: 1_000,
            large_bytes: 30 << 20,
        }
    }

    /// About 320 MB in 17,000 files, one of them 200 MB: for `--full`.
    pub fn full() -> TreeSpec {
        TreeSpec {
            source_files: 3_000,
            module_files: 10_000,
            logs: 4,
            log_bytes: 5 << 20,
            blobs: 20,
            blob_bytes: 1 << 20,
            venv_files: 4_000,
            large_bytes: 200 << 20,
        }
    }

    /// How many regular files the tree has.
    pub fn file_count(&self) -> usize {
        1 + self.source_files
            + self.module_files
            + self.logs
            + self.blobs
            + self.venv_files
            + usize::from(self.large_bytes > 0)
    }
}

/// What was generated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeStats {
    /// Regular files written.
    pub files: u64,
    /// Directories created.
    pub dirs: u64,
    /// Bytes of file content.
    pub bytes: u64,
}

/// The shared seeded generator, drawing the sizes and indices this module needs as `usize`.
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }

    fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.0.between(lo as u64, hi as u64) as usize
    }
}

const WORDS: &[&str] = &[
    "const",
    "let",
    "function",
    "return",
    "if",
    "else",
    "for",
    "while",
    "await",
    "async",
    "import",
    "export",
    "from",
    "class",
    "extends",
    "new",
    "this",
    "null",
    "undefined",
    "true",
    "false",
    "value",
    "result",
    "options",
    "config",
    "request",
    "response",
    "error",
    "data",
    "items",
    "index",
    "length",
    "push",
    "map",
    "filter",
    "reduce",
    "then",
    "catch",
    "resolve",
    "reject",
    "Promise",
    "Object",
    "Array",
    "String",
    "Number",
    "JSON",
    "parse",
    "stringify",
    "module",
    "require",
    "exports",
    "props",
    "state",
    "render",
    "handler",
    "callback",
    "event",
    "listener",
    "buffer",
    "stream",
    "path",
    "join",
    "read",
    "write",
    "file",
    "dir",
    "cache",
    "token",
    "user",
    "session",
    "id",
    "name",
    "type",
    "key",
    "get",
    "set",
    "has",
    "delete",
];

const PUNCT: &[&str] = &[
    " = ", "(", ")", " {", "}", ";", ", ", ".", " => ", " === ", "[", "]",
];

/// Appends about `bytes` of code-like text.
fn code(rng: &mut Rng, bytes: usize, out: &mut Vec<u8>) {
    let end = out.len() + bytes;
    let mut indent = 0usize;
    while out.len() < end {
        out.resize(out.len() + indent * 2, b' ');
        let words = rng.range(2, 9);
        for w in 0..words {
            out.extend_from_slice(WORDS[rng.below(WORDS.len())].as_bytes());
            if rng.below(4) == 0 {
                // Identifiers with numbers, as generated and minified code has.
                out.extend_from_slice(format!("{}", rng.below(1000)).as_bytes());
            }
            if w + 1 < words {
                out.extend_from_slice(PUNCT[rng.below(PUNCT.len())].as_bytes());
            }
        }
        out.extend_from_slice(b";\n");
        match rng.below(6) {
            0 if indent < 6 => indent += 1,
            1 => indent = indent.saturating_sub(1),
            _ => {}
        }
    }
    out.truncate(end);
}

/// Appends about `bytes` of log lines (timestamps, levels, repeated messages).
fn log(rng: &mut Rng, bytes: usize, out: &mut Vec<u8>) {
    const LEVELS: &[&str] = &["INFO", "DEBUG", "WARN", "INFO", "INFO"];
    let end = out.len() + bytes;
    let mut t = 1_700_000_000_000u64;
    while out.len() < end {
        t += rng.range(1, 400) as u64;
        let line = format!(
            "{t} {} [worker-{}] {} {} in {} ms (request {:08x})\n",
            LEVELS[rng.below(LEVELS.len())],
            rng.below(8),
            WORDS[rng.below(WORDS.len())],
            WORDS[rng.below(WORDS.len())],
            rng.below(5000),
            rng.next() as u32,
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(end);
}

fn blob(rng: &mut Rng, bytes: usize, out: &mut Vec<u8>) {
    while out.len() < bytes {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(bytes);
}

struct Writer<'a> {
    root: &'a Path,
    stats: TreeStats,
    buf: Vec<u8>,
}

impl Writer<'_> {
    fn dir(&mut self, rel: &str) -> io::Result<()> {
        fs::create_dir_all(self.root.join(rel))?;
        self.stats.dirs += 1;
        Ok(())
    }

    /// Writes `self.buf` to `rel` and clears it.
    fn file(&mut self, rel: &str) -> io::Result<()> {
        let mut f = fs::File::create(self.root.join(rel))?;
        f.write_all(&self.buf)?;
        self.stats.files += 1;
        self.stats.bytes += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// Writes a tree shaped by `spec` under `root` (which must exist).
pub fn generate_workspace(root: &Path, spec: &TreeSpec, seed: u64) -> io::Result<TreeStats> {
    let mut rng = Rng(SplitMix64::new(seed));
    let mut w = Writer {
        root,
        stats: TreeStats::default(),
        buf: Vec::with_capacity(64 * 1024),
    };

    // Source: src/<area>/<module>/<file>, about 25 files per directory.
    w.buf
        .extend_from_slice(b"{\n  \"name\": \"agent-project\",\n  \"version\": \"1.0.0\"\n}\n");
    w.file("package.json")?;
    for i in 0..spec.source_files {
        let area = i / 250;
        let module = (i / 25) % 10;
        let dir = format!("src/area{area}/mod{module}");
        if i % 25 == 0 {
            w.dir(&dir)?;
        }
        let size = rng.range(1024, 16 * 1024);
        code(&mut rng, size, &mut w.buf);
        let ext = ["ts", "tsx", "js", "json", "css"][rng.below(5)];
        w.file(&format!("{dir}/file{i}.{ext}"))?;
    }

    // node_modules: packages of ~12 files: package.json, README, index.js, lib/*, a minified dist.
    let mut written = 0usize;
    let mut pkg = 0usize;
    while written < spec.module_files {
        let scope = if pkg.is_multiple_of(7) {
            format!("@scope{}/", pkg % 13)
        } else {
            String::new()
        };
        let base = format!("node_modules/{scope}pkg-{pkg}");
        w.dir(&format!("{base}/lib"))?;
        w.dir(&format!("{base}/dist"))?;
        let files = rng.range(6, 18).min(spec.module_files - written);
        for f in 0..files {
            let (rel, size) = match f {
                0 => (format!("{base}/package.json"), rng.range(200, 1200)),
                1 => (format!("{base}/README.md"), rng.range(500, 6000)),
                2 => (format!("{base}/index.js"), rng.range(200, 2000)),
                3 => (format!("{base}/dist/index.min.js"), rng.range(2000, 6000)),
                n => (format!("{base}/lib/part{n}.js"), rng.range(200, 4000)),
            };
            code(&mut rng, size, &mut w.buf);
            w.file(&rel)?;
        }
        written += files;
        pkg += 1;
    }

    if spec.logs > 0 {
        w.dir("build")?;
    }
    for i in 0..spec.logs {
        log(&mut rng, spec.log_bytes, &mut w.buf);
        w.file(&format!("build/run{i}.log"))?;
    }
    if spec.blobs > 0 {
        w.dir("assets")?;
    }
    for i in 0..spec.blobs {
        blob(&mut rng, spec.blob_bytes, &mut w.buf);
        w.file(&format!("assets/blob{i}.bin"))?;
    }

    // A virtualenv: packages of sources with their byte-compiled caches, and the interpreter
    // symlinks every venv has.
    if spec.venv_files > 0 {
        w.dir(".venv/bin")?;
        std::os::unix::fs::symlink("/usr/bin/python3", root.join(".venv/bin/python"))?;
        std::os::unix::fs::symlink("python", root.join(".venv/bin/python3"))?;
    }
    let mut written = 0usize;
    let mut pkg = 0usize;
    while written < spec.venv_files {
        let base = format!(".venv/lib/python3.12/site-packages/pypkg{pkg}");
        w.dir(&format!("{base}/__pycache__"))?;
        let files = rng.range(4, 16).min(spec.venv_files - written);
        for f in 0..files {
            if f % 2 == 0 {
                let size = rng.range(500, 12_000);
                code(&mut rng, size, &mut w.buf);
                w.file(&format!("{base}/mod{f}.py"))?;
            } else {
                // A .pyc: a header, then marshalled code (half text, half binary).
                let size = rng.range(300, 4000);
                code(&mut rng, size, &mut w.buf);
                let len = w.buf.len();
                blob(&mut rng, len + len / 2, &mut w.buf);
                w.file(&format!("{base}/__pycache__/mod{f}.cpython-312.pyc"))?;
            }
        }
        written += files;
        pkg += 1;
    }

    // One large file: 64 KiB pages, alternately rows of text and binary.
    if spec.large_bytes > 0 {
        w.dir("data")?;
        let mut f = fs::File::create(root.join(LARGE_FILE))?;
        let mut page = Vec::with_capacity(64 * 1024);
        let mut left = spec.large_bytes;
        let mut n = 0usize;
        while left > 0 {
            page.clear();
            let size = left.min(64 * 1024);
            if n.is_multiple_of(2) {
                log(&mut rng, size, &mut page);
            } else {
                blob(&mut rng, size, &mut page);
            }
            f.write_all(&page)?;
            left -= size;
            n += 1;
        }
        w.stats.files += 1;
        w.stats.bytes += spec.large_bytes as u64;
    }
    Ok(w.stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_tree_has_its_files_and_is_deterministic() {
        let a = std::env::temp_dir().join(format!("tbx-ws-a-{}", std::process::id()));
        let b = std::env::temp_dir().join(format!("tbx-ws-b-{}", std::process::id()));
        for d in [&a, &b] {
            let _ = fs::remove_dir_all(d);
            fs::create_dir_all(d).unwrap();
        }
        let spec = TreeSpec::quick();
        let sa = generate_workspace(&a, &spec, 7).unwrap();
        let sb = generate_workspace(&b, &spec, 7).unwrap();
        assert_eq!(sa, sb);
        assert_eq!(sa.files, spec.file_count() as u64);
        assert_eq!(
            fs::read(find(&a, "file0.")).unwrap(),
            fs::read(find(&b, "file0.")).unwrap()
        );
        for d in [&a, &b] {
            fs::remove_dir_all(d).unwrap();
        }
    }

    fn find(root: &Path, prefix: &str) -> std::path::PathBuf {
        let dir = root.join("src/area0/mod0");
        fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
            .unwrap()
    }
}
