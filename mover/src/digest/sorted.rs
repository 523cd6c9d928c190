//! The receiver's side of the `tree` part: entries arrive in any order (over several streams,
//! files complete whenever their last block lands), so each one is recorded as `(path, kind,
//! entry hash)`, the records are sorted in path order with bounded memory (sorted runs spilled to
//! anonymous files, merged at the end), and the sorted stream is folded into the same Merkle tree
//! the sender builds: in path order a directory comes right before its descendants and siblings
//! come in name order, so one stack of open directories suffices.

use std::cmp::Ordering;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use super::{Hash, Listing, dir_entry, path_order, split_path};

/// Bytes of records kept in memory before a sorted run is spilled.
const DEFAULT_MEMORY: usize = 8 * 1024 * 1024;
/// Runs of one level merged into one run of the next level.
const FAN_IN: usize = 8;
/// Read/write buffer per run file.
const RUN_BUFFER: usize = 64 * 1024;

const REC_LEAF: u8 = 0;
const REC_DIR: u8 = 1;

/// Opens a new anonymous spill file (read-write, positioned at 0).
pub type SpillFn = Box<dyn Fn() -> std::io::Result<File> + Send + Sync>;

/// Records entries in any order; [`SortedTree::finish`] folds them into the root's listing hash.
pub struct SortedTree {
    buf: Vec<u8>,
    /// (offset, length) of each record in `buf`.
    recs: Vec<(usize, usize)>,
    runs: Vec<Run>,
    spill: SpillFn,
    memory: usize,
}

struct Run {
    level: u32,
    file: File,
}

/// A record: u32 LE path length, path, u8 kind, 32-byte entry hash (zeros for directories).
fn encode(out: &mut Vec<u8>, path: &[u8], kind: u8, hash: &Hash) {
    out.extend_from_slice(&(path.len() as u32).to_le_bytes());
    out.extend_from_slice(path);
    out.push(kind);
    out.extend_from_slice(hash);
}

fn decode(rec: &[u8]) -> Option<(&[u8], u8, Hash)> {
    let len = u32::from_le_bytes(rec.get(..4)?.try_into().ok()?) as usize;
    let path = rec.get(4..4 + len)?;
    let kind = *rec.get(4 + len)?;
    let hash: Hash = rec.get(5 + len..37 + len)?.try_into().ok()?;
    Some((path, kind, hash))
}

fn rec_order(a: &[u8], b: &[u8]) -> Ordering {
    match (decode(a), decode(b)) {
        (Some((pa, ..)), Some((pb, ..))) => path_order(pa, pb).then_with(|| a.cmp(b)),
        _ => a.cmp(b),
    }
}

fn corrupt() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, "corrupt digest spill file")
}

struct RunReader {
    r: BufReader<File>,
    head: Option<Vec<u8>>,
}

impl RunReader {
    fn new(mut file: File) -> std::io::Result<Self> {
        file.seek(SeekFrom::Start(0))?;
        let mut r = Self {
            r: BufReader::with_capacity(RUN_BUFFER, file),
            head: None,
        };
        r.advance()?;
        Ok(r)
    }

    fn advance(&mut self) -> std::io::Result<()> {
        let mut len = [0u8; 4];
        match self.r.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.head = None;
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > 16 * 1024 {
            return Err(corrupt());
        }
        let mut rec = self.head.take().unwrap_or_default();
        rec.resize(len, 0);
        self.r.read_exact(&mut rec)?;
        self.head = Some(rec);
        Ok(())
    }
}

/// Merges sorted runs, calling `emit` for each record in order.
fn merge(
    files: Vec<File>,
    mut emit: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut readers = files
        .into_iter()
        .map(RunReader::new)
        .collect::<std::io::Result<Vec<_>>>()?;
    loop {
        // At most FAN_IN runs per level and a few levels: a linear scan beats a heap here.
        let mut best: Option<usize> = None;
        for (i, r) in readers.iter().enumerate() {
            let Some(h) = &r.head else { continue };
            best = match best {
                Some(b)
                    if readers[b]
                        .head
                        .as_deref()
                        .is_some_and(|bh| rec_order(bh, h) != Ordering::Greater) =>
                {
                    Some(b)
                }
                _ => Some(i),
            };
        }
        let Some(b) = best else { return Ok(()) };
        if let Some(h) = &readers[b].head {
            emit(h)?;
        }
        readers[b].advance()?;
    }
}

fn write_rec(w: &mut impl Write, rec: &[u8]) -> std::io::Result<()> {
    w.write_all(&(rec.len() as u32).to_le_bytes())?;
    w.write_all(rec)
}

impl SortedTree {
    /// Spill files come from `spill` (for the receiver: anonymous files in its staging
    /// directory).
    pub fn new(spill: SpillFn) -> Self {
        Self::with_memory(spill, DEFAULT_MEMORY)
    }

    /// Like [`SortedTree::new`] with a chosen in-memory budget (tests use a tiny one).
    pub fn with_memory(spill: SpillFn, memory: usize) -> Self {
        Self {
            buf: Vec::new(),
            recs: Vec::new(),
            runs: Vec::new(),
            spill,
            memory: memory.max(64),
        }
    }

    /// A file or symlink at `path` with its entry hash.
    pub fn add_leaf(&mut self, path: &[u8], entry: &Hash) -> std::io::Result<()> {
        self.push(path, REC_LEAF, entry)
    }

    /// A directory at `path` (its listing is computed from its children at the end).
    pub fn add_dir(&mut self, path: &[u8]) -> std::io::Result<()> {
        self.push(path, REC_DIR, &[0; 32])
    }

    fn push(&mut self, path: &[u8], kind: u8, hash: &Hash) -> std::io::Result<()> {
        let start = self.buf.len();
        encode(&mut self.buf, path, kind, hash);
        self.recs.push((start, self.buf.len() - start));
        if self.buf.len() >= self.memory {
            self.spill_memory()?;
        }
        Ok(())
    }

    fn sort_memory(&mut self) {
        let buf = &self.buf;
        self.recs
            .sort_unstable_by(|a, b| rec_order(&buf[a.0..a.0 + a.1], &buf[b.0..b.0 + b.1]));
    }

    fn spill_memory(&mut self) -> std::io::Result<()> {
        self.sort_memory();
        let file = (self.spill)()?;
        {
            let mut w = BufWriter::with_capacity(RUN_BUFFER, &file);
            for &(off, len) in &self.recs {
                write_rec(&mut w, &self.buf[off..off + len])?;
            }
            w.flush()?;
        }
        self.buf.clear();
        self.recs.clear();
        self.runs.push(Run { level: 0, file });
        // Like a binary counter: FAN_IN runs of one level become one run of the next, so every
        // record is rewritten O(log n) times and few files are open at once.
        while let Some(level) = self.runs.last().map(|r| r.level) {
            let same = self
                .runs
                .iter()
                .rev()
                .take_while(|r| r.level == level)
                .count();
            if same < FAN_IN {
                break;
            }
            let tail: Vec<File> = self
                .runs
                .split_off(self.runs.len() - same)
                .into_iter()
                .map(|r| r.file)
                .collect();
            let out = (self.spill)()?;
            {
                let mut w = BufWriter::with_capacity(RUN_BUFFER, &out);
                merge(tail, |rec| write_rec(&mut w, rec))?;
                w.flush()?;
            }
            self.runs.push(Run {
                level: level + 1,
                file: out,
            });
        }
        Ok(())
    }

    /// Sorts everything recorded and returns the root's listing hash.
    pub fn finish(mut self) -> std::io::Result<Hash> {
        let mut fold = Fold::default();
        if self.runs.is_empty() {
            self.sort_memory();
            for &(off, len) in &self.recs {
                fold.feed(&self.buf[off..off + len])?;
            }
        } else {
            if !self.recs.is_empty() {
                self.spill_memory()?;
            }
            let files = std::mem::take(&mut self.runs)
                .into_iter()
                .map(|r| r.file)
                .collect();
            merge(files, |rec| fold.feed(rec))?;
        }
        Ok(fold.finish())
    }
}

/// Folds records in path order into listing hashes: a stack of the open directories.
struct Fold {
    stack: Vec<(Vec<u8>, Listing)>,
}

impl Default for Fold {
    fn default() -> Self {
        Self {
            stack: vec![(Vec::new(), Listing::default())],
        }
    }
}

/// `dir` is `path`'s parent or a further ancestor (the root `""` is everyone's).
fn is_ancestor(dir: &[u8], path: &[u8]) -> bool {
    dir.is_empty() || (path.len() > dir.len() && path.starts_with(dir) && path[dir.len()] == b'/')
}

impl Fold {
    fn top_path(&self) -> &[u8] {
        self.stack.last().map(|(p, _)| p.as_slice()).unwrap_or(&[])
    }

    fn close_top(&mut self) {
        if self.stack.len() < 2 {
            return;
        }
        let Some((path, listing)) = self.stack.pop() else {
            return;
        };
        let entry = dir_entry(&listing.finish());
        let (_, name) = split_path(&path);
        if let Some((_, parent)) = self.stack.last_mut() {
            parent.add(name, &entry);
        }
    }

    fn feed(&mut self, rec: &[u8]) -> std::io::Result<()> {
        let (path, kind, hash) = decode(rec).ok_or_else(corrupt)?;
        while self.stack.len() > 1 && !is_ancestor(self.top_path(), path) {
            self.close_top();
        }
        let (parent, name) = split_path(path);
        // A directory never reported itself: open it so its children still nest correctly.
        while self.top_path() != parent {
            let top = self.top_path();
            let rest_start = if top.is_empty() { 0 } else { top.len() + 1 };
            let rest = &parent[rest_start..];
            let comp = rest.iter().position(|c| *c == b'/').unwrap_or(rest.len());
            let next = parent[..rest_start + comp].to_vec();
            self.stack.push((next, Listing::default()));
        }
        if kind == REC_DIR {
            self.stack.push((path.to_vec(), Listing::default()));
        } else if let Some((_, listing)) = self.stack.last_mut() {
            listing.add(name, &hash);
        }
        Ok(())
    }

    fn finish(mut self) -> Hash {
        while self.stack.len() > 1 {
            self.close_top();
        }
        self.stack
            .last()
            .map(|(_, l)| l.finish())
            .unwrap_or_default()
    }
}

/// An anonymous read-write file in `dir`: `O_TMPFILE` where supported, else a named file that
/// is unlinked at once.
pub fn anonymous_file_in(dir: std::os::fd::BorrowedFd<'_>) -> std::io::Result<File> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    use rustix::io::Errno;
    let mode = Mode::from_raw_mode(0o600);
    match rustix::fs::openat(
        dir,
        c".",
        OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC,
        mode,
    ) {
        Ok(fd) => return Ok(File::from(fd)),
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {}
        Err(e) => return Err(e.into()),
    }
    loop {
        let name = format!(".ferry-digest.{:016x}", rand::random::<u64>());
        match rustix::fs::openat(
            dir,
            name.as_str(),
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        ) {
            Ok(fd) => {
                let _ = rustix::fs::unlinkat(dir, name.as_str(), AtFlags::empty());
                return Ok(File::from(fd));
            }
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
