use std::collections::BTreeMap;

use super::*;

/// A tree for the tests: path -> Some(leaf entry hash) for files/symlinks, None for dirs.
type Entries = BTreeMap<Vec<u8>, Option<Hash>>;

fn leaf(n: u64) -> Hash {
    *blake3::hash(&n.to_le_bytes()).as_bytes()
}

/// Reference: a recursive definition straight from the docs.
fn reference(entries: &Entries) -> Hash {
    fn listing(entries: &Entries, dir: &[u8]) -> Hash {
        let mut children: Vec<(&[u8], Hash)> = Vec::new();
        for (path, e) in entries {
            let (parent, name) = split_path(path);
            if parent != dir {
                continue;
            }
            let h = match e {
                Some(h) => *h,
                None => dir_entry(&listing(entries, path)),
            };
            children.push((name, h));
        }
        children.sort();
        let mut l = Listing::default();
        for (name, h) in children {
            l.add(name, &h);
        }
        l.finish()
    }
    listing(entries, b"")
}

/// Deterministic pseudo-random generator (no extra dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random tree with names that stress the ordering (`a`, `a.b`, `a-`, `a/b` ...).
fn random_tree(seed: u64, size: usize) -> Entries {
    let names: [&[u8]; 7] = [b"a", b"a.b", b"a-", b"b", b"ab", b"\xc3\xa9", b"Z"];
    let mut rng = Rng(seed | 1);
    let mut entries = Entries::new();
    let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
    for i in 0..size {
        let parent = dirs[rng.below(dirs.len() as u64) as usize].clone();
        let base = names[rng.below(names.len() as u64) as usize];
        let mut name = base.to_vec();
        name.extend_from_slice(format!("{}", i % 5).as_bytes());
        let path = if parent.is_empty() {
            name
        } else {
            [parent.as_slice(), b"/", name.as_slice()].concat()
        };
        if entries.contains_key(&path) {
            continue;
        }
        if rng.below(4) == 0 {
            entries.insert(path.clone(), None);
            dirs.push(path);
        } else {
            entries.insert(path, Some(leaf(rng.next())));
        }
    }
    entries
}

/// Feeds a [`TreeBuilder`] in a walk order (directories before children, children in a
/// shuffled order, directory closed after them) with file hashes delivered late and shuffled.
fn via_builder(entries: &Entries, seed: u64) -> Hash {
    let mut rng = Rng(seed | 1);
    let mut b = TreeBuilder::new();
    let mut late: Vec<(Vec<u8>, Hash)> = Vec::new();
    fn walk(
        entries: &Entries,
        dir: &[u8],
        b: &mut TreeBuilder,
        rng: &mut Rng,
        late: &mut Vec<(Vec<u8>, Hash)>,
    ) {
        let mut children: Vec<(&Vec<u8>, &Option<Hash>)> = entries
            .iter()
            .filter(|(p, _)| split_path(p).0 == dir)
            .collect();
        for i in (1..children.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            children.swap(i, j);
        }
        for (path, e) in children {
            match e {
                None => {
                    b.open_dir(path);
                    walk(entries, path, b, rng, late);
                }
                Some(h) if rng.below(2) == 0 => b.add(path, *h),
                Some(h) => {
                    b.expect(path);
                    late.push((path.clone(), *h));
                }
            }
            // Deliver some late hashes while the walk goes on.
            if !late.is_empty() && rng.below(3) == 0 {
                let k = rng.below(late.len() as u64) as usize;
                let (p, h) = late.swap_remove(k);
                b.fulfil(&p, h);
            }
        }
        b.close_dir(dir);
    }
    walk(entries, b"", &mut b, &mut rng, &mut late);
    assert!(b.root().is_none() || late.is_empty());
    while !late.is_empty() {
        let k = rng.below(late.len() as u64) as usize;
        let (p, h) = late.swap_remove(k);
        b.fulfil(&p, h);
    }
    assert_eq!(b.open_dirs(), 0, "every directory settled");
    b.root().expect("complete tree")
}

fn spill_to_temp() -> SpillFn {
    Box::new(tempfile_in_tmp)
}

fn tempfile_in_tmp() -> std::io::Result<std::fs::File> {
    let dir = std::fs::File::open(std::env::temp_dir())?;
    anonymous_file_in(std::os::fd::AsFd::as_fd(&dir))
}

/// Feeds a [`SortedTree`] in a random order (directories possibly after their children).
fn via_sorted(entries: &Entries, seed: u64, memory: usize) -> Hash {
    let mut rng = Rng(seed | 1);
    let mut all: Vec<(&Vec<u8>, &Option<Hash>)> = entries.iter().collect();
    for i in (1..all.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        all.swap(i, j);
    }
    let mut t = SortedTree::with_memory(spill_to_temp(), memory);
    for (path, e) in all {
        match e {
            None => t.add_dir(path).expect("add dir"),
            Some(h) => t.add_leaf(path, h).expect("add leaf"),
        }
    }
    t.finish().expect("finish")
}

#[test]
fn builder_sorted_and_reference_agree() {
    for seed in 1..40u64 {
        let entries = random_tree(seed, 5 + (seed as usize * 7) % 200);
        let want = reference(&entries);
        assert_eq!(via_builder(&entries, seed), want, "builder, seed {seed}");
        assert_eq!(
            via_sorted(&entries, seed, 8 << 20),
            want,
            "sorted in memory, seed {seed}"
        );
        // A tiny budget: many runs, merged over several levels.
        assert_eq!(
            via_sorted(&entries, seed + 1000, 64),
            want,
            "sorted with spills, seed {seed}"
        );
    }
}

#[test]
fn many_spill_levels_still_sort() {
    let entries = random_tree(7, 3000);
    assert!(entries.len() > 1000);
    assert_eq!(via_sorted(&entries, 3, 200), reference(&entries));
}

#[test]
fn empty_trees_and_empty_directories() {
    let empty = Entries::new();
    let r = reference(&empty);
    assert_eq!(via_builder(&empty, 1), r);
    assert_eq!(via_sorted(&empty, 1, 1 << 20), r);
    let mut one_dir = Entries::new();
    one_dir.insert(b"d".to_vec(), None);
    assert_ne!(reference(&one_dir), r, "an empty directory counts");
    assert_eq!(via_builder(&one_dir, 1), reference(&one_dir));
    assert_eq!(via_sorted(&one_dir, 1, 1 << 20), reference(&one_dir));
}

#[test]
fn any_change_changes_the_tree_hash() {
    let mut entries = Entries::new();
    entries.insert(b"a".to_vec(), None);
    entries.insert(b"a/f".to_vec(), Some(leaf(1)));
    entries.insert(b"b".to_vec(), Some(leaf(2)));
    let base = reference(&entries);
    // A leaf's hash.
    let mut e = entries.clone();
    e.insert(b"a/f".to_vec(), Some(leaf(3)));
    assert_ne!(reference(&e), base);
    // A name.
    let mut e = entries.clone();
    let h = e.remove(b"a/f".as_slice()).flatten();
    e.insert(b"a/g".to_vec(), h);
    assert_ne!(reference(&e), base);
    // Moving a file to another directory.
    let mut e = entries.clone();
    let h = e.remove(b"a/f".as_slice()).flatten();
    e.insert(b"f".to_vec(), h);
    assert_ne!(reference(&e), base);
    // A file where an empty directory was.
    let mut e = entries.clone();
    e.insert(b"c".to_vec(), None);
    let with_dir = reference(&e);
    e.insert(b"c".to_vec(), Some(leaf(0)));
    assert_ne!(reference(&e), with_dir);
}

#[test]
fn entry_hashes_cover_every_field() {
    let content = content_hash(&[leaf(1)]);
    let base = file_entry(10, 0o644, (5, 6), &content);
    assert_ne!(file_entry(11, 0o644, (5, 6), &content), base, "size");
    assert_ne!(file_entry(10, 0o600, (5, 6), &content), base, "mode");
    assert_ne!(file_entry(10, 0o644, (5, 7), &content), base, "mtime nsec");
    assert_ne!(file_entry(10, 0o644, (4, 6), &content), base, "mtime sec");
    assert_ne!(
        file_entry(10, 0o644, (5, 6), &content_hash(&[leaf(2)])),
        base,
        "content"
    );
    // Only the permission bits count (setuid etc. are never transferred).
    assert_eq!(file_entry(10, 0o4644, (5, 6), &content), base);
    let l = symlink_entry(0o777, (1, 2), b"target");
    assert_ne!(symlink_entry(0o777, (1, 2), b"targeT"), l);
    assert_ne!(symlink_entry(0o777, (1, 3), b"target"), l);
    let mut d1 = DirList::default();
    d1.add(b"a", 0o755, (1, 2));
    let mut d2 = DirList::default();
    d2.add(b"a", 0o750, (1, 2));
    assert_ne!(d1.finish(), d2.finish());
    let mut l1 = LinkList::default();
    l1.add(b"x", b"y", 0o644, (1, 2));
    let mut l2 = LinkList::default();
    l2.add(b"x", b"z", 0o644, (1, 2));
    assert_ne!(l1.finish(), l2.finish());
    let (t, d, l) = (leaf(1), leaf(2), leaf(3));
    assert_ne!(transfer_digest(&t, &d, &l), transfer_digest(&t, &l, &d));
}

#[test]
fn path_order_is_component_order() {
    let mut v: Vec<&[u8]> = vec![b"a.b", b"a/b", b"a", b"ab/c", b"a/c", b"a-", b"b"];
    v.sort_by(|x, y| path_order(x, y));
    assert_eq!(
        v,
        vec![
            b"a".as_slice(),
            b"a/b",
            b"a/c",
            b"a-",
            b"a.b",
            b"ab/c",
            b"b"
        ]
    );
}

#[test]
fn content_hash_is_over_block_hashes() {
    let data = vec![7u8; BLOCK_SIZE * 2 + 5];
    let blocks: Vec<Hash> = data
        .chunks(BLOCK_SIZE)
        .map(|c| *blake3::hash(c).as_bytes())
        .collect();
    let read = hash_reader(&mut data.as_slice(), &mut Vec::new(), true).expect("read");
    assert_eq!(read.content, content_hash(&blocks));
    assert_eq!(read.whole, Some(*blake3::hash(&data).as_bytes()));
    assert_eq!(read.len, data.len() as u64);
    // One block: the single-block shortcut agrees; an empty file has no blocks.
    let small = b"hello";
    let read = hash_reader(&mut small.as_slice(), &mut Vec::new(), false).expect("read");
    assert_eq!(read.whole, None);
    assert_eq!(
        read.content,
        content_hash_single(5, blake3::hash(small).as_bytes())
    );
    let read = hash_reader(&mut [].as_slice(), &mut Vec::new(), false).expect("read");
    assert_eq!(read.content, content_hash(&[]));
    assert_eq!(read.content, content_hash_single(0, &[9; 32]));
    // Blocks arriving out of order, some twice.
    let mut bh = BlockHashes::new(3);
    assert_eq!(bh.set(2, blocks[2]), None);
    assert_eq!(bh.set(2, [0; 32]), None, "first value wins");
    assert_eq!(bh.set(0, blocks[0]), None);
    assert_eq!(bh.set(9, [0; 32]), None, "out of range ignored");
    assert_eq!(bh.set(1, blocks[1]), Some(content_hash(&blocks)));
}

#[test]
fn hex_round_trips() {
    let h = leaf(42);
    let s = hex(&h);
    assert_eq!(s.len(), 64);
    assert_eq!(parse_hex(&s), Some(h));
    assert_eq!(parse_hex("xyz"), None);
}

#[test]
fn anonymous_spill_files_leave_no_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = std::fs::File::open(dir.path()).expect("open");
    let mut f = anonymous_file_in(std::os::fd::AsFd::as_fd(&d)).expect("anon");
    use std::io::{Read, Seek, Write};
    f.write_all(b"abc").expect("write");
    f.rewind().expect("rewind");
    let mut s = String::new();
    f.read_to_string(&mut s).expect("read");
    assert_eq!(s, "abc");
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
}
