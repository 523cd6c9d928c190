//! The end-to-end transfer digest (docs/protocol.md, "Transfer digest"): one BLAKE3 value that
//! both movers compute independently, the sender over its source and the receiver over what it
//! committed, and that must agree for a transfer to succeed.
//!
//! The digest is `BLAKE3("FERRYDG1" || tree || dirs || links)`:
//! - `tree`: a Merkle tree over the directory structure. A directory's listing hash is BLAKE3
//!   over its children's `(name, entry hash)` records in name order; a file's entry hash covers
//!   its size, mode, mtime and content hash, a symlink's its mode, mtime and target, a
//!   directory's its listing hash. `tree` is the root's listing hash.
//! - `dirs`: BLAKE3 over `(path, mode, mtime)` of every directory but the root, in path order
//!   (the order the sender's DirDone frames travel in).
//! - `links`: BLAKE3 over `(path, target, mode, mtime)` of every hard link, in path order (the
//!   order the sender offers them in).
//!
//! A file's content hash is BLAKE3 over the BLAKE3 hashes of its 4 MiB blocks (the same blocks
//! and hashes the protocol verifies), so neither end reads a transferred file twice.
//!
//! Memory: the sender builds the tree while it walks ([`TreeBuilder`]: open directories and
//! directories whose files are in flight); the receiver, which learns entries in any order,
//! spills `(path, entry hash)` records to its staging directory and sorts them
//! ([`SortedTree`]). Neither grows with the number of files beyond the widest directory.

mod pool;
mod sorted;
mod tree;

use std::cmp::Ordering;
use std::io::Read;
use std::os::unix::fs::FileExt;

pub use pool::{HashError, HashPool};
pub use sorted::{SortedTree, SpillFn, anonymous_file_in};
pub use tree::TreeBuilder;

use crate::wire::BLOCK_SIZE;

/// A BLAKE3 value.
pub type Hash = [u8; 32];

/// Entry kinds inside the tree (the protocol's `EntryKind` numbers).
pub const KIND_FILE: u8 = 1;
pub const KIND_DIR: u8 = 2;
pub const KIND_SYMLINK: u8 = 3;

const TREE_MAGIC: &[u8; 8] = b"FERRYDIR";
const DIRS_MAGIC: &[u8; 8] = b"FERRYDMT";
const LINKS_MAGIC: &[u8; 8] = b"FERRYHLN";
const DIGEST_MAGIC: &[u8; 8] = b"FERRYDG1";

/// Lowercase hex of a hash (64 digits).
pub fn hex(h: &Hash) -> String {
    blake3::Hash::from_bytes(*h).to_hex().to_string()
}

/// Parses 64 hex digits.
pub fn parse_hex(s: &str) -> Option<Hash> {
    if s.len() != 64 {
        return None;
    }
    blake3::Hash::from_hex(s).ok().map(|h| *h.as_bytes())
}

/// Orders paths component by component (`a` < `a/b` < `a.b`): plain byte order with `/` below
/// every other byte. For one directory's children it is byte order of their names.
pub fn path_order(a: &[u8], b: &[u8]) -> Ordering {
    let key = |c: &u8| if *c == b'/' { 0 } else { *c };
    a.iter().map(key).cmp(b.iter().map(key))
}

/// Content hash of a file from the BLAKE3 hashes of its blocks, in order (none for an empty
/// file).
pub fn content_hash(blocks: &[Hash]) -> Hash {
    let mut h = blake3::Hasher::new();
    for b in blocks {
        h.update(b);
    }
    *h.finalize().as_bytes()
}

/// Content hash of a file of `size` <= [`BLOCK_SIZE`] bytes whose bytes hash to `block`.
pub fn content_hash_single(size: u64, block: &Hash) -> Hash {
    if size == 0 {
        content_hash(&[])
    } else {
        content_hash(std::slice::from_ref(block))
    }
}

/// The block hashes of one file as they become known, in any order and from any source (sent,
/// announced, resumed, or read only for the digest); the first value for a block counts.
pub struct BlockHashes {
    hashes: Vec<Hash>,
    have: Vec<bool>,
    missing: usize,
}

impl BlockHashes {
    pub fn new(nblocks: u64) -> Self {
        let n = nblocks as usize;
        Self {
            hashes: vec![[0; 32]; n],
            have: vec![false; n],
            missing: n,
        }
    }

    /// Records block `index`; the file's content hash once this was the last one missing.
    pub fn set(&mut self, index: u64, hash: Hash) -> Option<Hash> {
        let i = usize::try_from(index).ok()?;
        if self.have.get(i).copied() != Some(false) {
            return None;
        }
        self.have[i] = true;
        self.hashes[i] = hash;
        self.missing -= 1;
        (self.missing == 0).then(|| content_hash(&self.hashes))
    }
}

/// What [`hash_reader`] read.
pub struct ReadHashes {
    /// The digest's content hash.
    pub content: Hash,
    /// BLAKE3 of the whole content (the protocol's `--checksum` value), when asked for.
    pub whole: Option<Hash>,
    pub len: u64,
}

/// Read size of [`hash_reader`].
const READ_PIECE: usize = 256 * 1024;

/// Whether `[off, off + len)` of `f` is a hole with data after it (so within the file): it reads
/// as zeros without being read. One `lseek(SEEK_DATA)`; false when the filesystem cannot tell
/// or nothing follows (then the caller reads, which also notices a file that shrank).
pub fn is_hole(f: &std::fs::File, off: u64, len: u64) -> bool {
    matches!(
        rustix::fs::seek(f, rustix::fs::SeekFrom::Data(off)),
        Ok(data) if data >= off.saturating_add(len)
    )
}

/// A reader that adds what it reads to a counter (the work an end reports while it hashes).
pub struct CountingReader<'a, R> {
    pub inner: R,
    pub count: &'a std::sync::atomic::AtomicU64,
}

impl<R: Read> Read for CountingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads `r` to its end and returns the content hash (block by block, 4 MiB each) and, with
/// `whole`, the whole-file BLAKE3 from the same read. `buf` is reused between calls.
pub fn hash_reader(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
    whole: bool,
) -> std::io::Result<ReadHashes> {
    if buf.len() < READ_PIECE {
        *buf = vec![0; READ_PIECE];
    }
    let mut blocks = Vec::new();
    let mut all = whole.then(blake3::Hasher::new);
    let mut block = blake3::Hasher::new();
    let mut in_block = 0usize;
    let mut len = 0u64;
    loop {
        let want = (BLOCK_SIZE - in_block).min(READ_PIECE);
        let n = match r.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let piece = &buf[..n];
        if let Some(a) = &mut all {
            a.update(piece);
        }
        block.update(piece);
        in_block += n;
        len += n as u64;
        if in_block == BLOCK_SIZE {
            blocks.push(*block.finalize().as_bytes());
            block.reset();
            in_block = 0;
        }
    }
    if in_block > 0 {
        blocks.push(*block.finalize().as_bytes());
    }
    Ok(ReadHashes {
        content: content_hash(&blocks),
        whole: all.map(|a| *a.finalize().as_bytes()),
        len,
    })
}

/// BLAKE3 of block `index` of a file of `size` bytes, read with `pread`. `UnexpectedEof` when
/// the file is shorter now.
pub fn hash_block_at(
    f: &std::fs::File,
    size: u64,
    index: u64,
    buf: &mut Vec<u8>,
) -> std::io::Result<Hash> {
    let off = index * BLOCK_SIZE as u64;
    let len = size.saturating_sub(off).min(BLOCK_SIZE as u64) as usize;
    if len == BLOCK_SIZE && is_hole(f, off, len as u64) {
        return Ok(crate::wire::zero_block_hash());
    }
    if buf.len() < len {
        *buf = vec![0; BLOCK_SIZE];
    }
    let block = &mut buf[..len];
    f.read_exact_at(block, off)?;
    Ok(*blake3::hash(block).as_bytes())
}

fn entry_hash(
    kind: u8,
    size: u64,
    mode: u32,
    mtime: (i64, u32),
    target: &[u8],
    content: &Hash,
) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(&[kind]);
    h.update(&size.to_le_bytes());
    h.update(&(mode & 0o777).to_le_bytes());
    h.update(&mtime.0.to_le_bytes());
    h.update(&mtime.1.to_le_bytes());
    h.update(&(target.len() as u32).to_le_bytes());
    h.update(target);
    h.update(content);
    *h.finalize().as_bytes()
}

/// Entry hash of a regular file.
pub fn file_entry(size: u64, mode: u32, mtime: (i64, u32), content: &Hash) -> Hash {
    entry_hash(KIND_FILE, size, mode, mtime, &[], content)
}

/// Entry hash of a symlink.
pub fn symlink_entry(mode: u32, mtime: (i64, u32), target: &[u8]) -> Hash {
    entry_hash(KIND_SYMLINK, 0, mode, mtime, target, &[0; 32])
}

/// Entry hash of a directory (its metadata is in the `dirs` list, not here).
pub fn dir_entry(listing: &Hash) -> Hash {
    entry_hash(KIND_DIR, 0, 0, (0, 0), &[], listing)
}

/// A directory's listing hash, fed its children in name order.
pub struct Listing(blake3::Hasher);

impl Default for Listing {
    fn default() -> Self {
        let mut h = blake3::Hasher::new();
        h.update(TREE_MAGIC);
        Self(h)
    }
}

impl Listing {
    pub fn add(&mut self, name: &[u8], entry: &Hash) {
        self.0.update(&(name.len() as u32).to_le_bytes());
        self.0.update(name);
        self.0.update(entry);
    }

    pub fn finish(&self) -> Hash {
        *self.0.finalize().as_bytes()
    }
}

/// The `dirs` list: directory metadata in the order the directories are reported.
pub struct DirList(blake3::Hasher);

impl Default for DirList {
    fn default() -> Self {
        let mut h = blake3::Hasher::new();
        h.update(DIRS_MAGIC);
        Self(h)
    }
}

impl DirList {
    pub fn add(&mut self, path: &[u8], mode: u32, mtime: (i64, u32)) {
        self.0.update(&(path.len() as u32).to_le_bytes());
        self.0.update(path);
        self.0.update(&(mode & 0o777).to_le_bytes());
        self.0.update(&mtime.0.to_le_bytes());
        self.0.update(&mtime.1.to_le_bytes());
    }

    pub fn finish(&self) -> Hash {
        *self.0.finalize().as_bytes()
    }
}

/// The `links` list: hard links in the order they are offered.
pub struct LinkList(blake3::Hasher);

impl Default for LinkList {
    fn default() -> Self {
        let mut h = blake3::Hasher::new();
        h.update(LINKS_MAGIC);
        Self(h)
    }
}

impl LinkList {
    pub fn add(&mut self, path: &[u8], target: &[u8], mode: u32, mtime: (i64, u32)) {
        self.0.update(&(path.len() as u32).to_le_bytes());
        self.0.update(path);
        self.0.update(&(target.len() as u32).to_le_bytes());
        self.0.update(target);
        self.0.update(&(mode & 0o777).to_le_bytes());
        self.0.update(&mtime.0.to_le_bytes());
        self.0.update(&mtime.1.to_le_bytes());
    }

    pub fn finish(&self) -> Hash {
        *self.0.finalize().as_bytes()
    }
}

/// The transfer digest from its three parts.
pub fn transfer_digest(tree: &Hash, dirs: &Hash, links: &Hash) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(DIGEST_MAGIC);
    h.update(tree);
    h.update(dirs);
    h.update(links);
    *h.finalize().as_bytes()
}

/// Splits a relative path into its parent (`""` for the root) and its last name.
pub(crate) fn split_path(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|c| *c == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

#[cfg(test)]
mod tests;
