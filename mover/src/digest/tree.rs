//! The sender's Merkle tree, built while the walk goes on: a directory is hashed as soon as its
//! listing is complete and every child's entry hash is known (a file's only once its content was
//! read), then its own entry goes into its parent. Memory: the directories still open or still
//! waiting for files in flight, each with the `(name, hash)` of the children it has so far.

use std::collections::HashMap;

use super::{Hash, Listing, dir_entry, split_path};

#[derive(Default)]
struct Node {
    children: Vec<(Box<[u8]>, Hash)>,
    /// Children whose entry hash is still unknown, plus one while the listing is open.
    pending: u64,
}

/// Builds the `tree` part of the digest from events in walk order (directories before their
/// children) and entry hashes in any order.
pub struct TreeBuilder {
    nodes: HashMap<Vec<u8>, Node>,
    root: Option<Hash>,
    /// An event that does not fit the tree (a bug): the digest is then never produced.
    broken: bool,
}

impl Default for TreeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TreeBuilder {
    /// A tree whose root listing is open.
    pub fn new() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            Vec::new(),
            Node {
                children: Vec::new(),
                pending: 1,
            },
        );
        Self {
            nodes,
            root: None,
            broken: false,
        }
    }

    /// A directory was reported (before its children): it is a pending child of its parent and
    /// its own listing is open until [`TreeBuilder::close_dir`].
    pub fn open_dir(&mut self, path: &[u8]) {
        self.expect(path);
        let node = Node {
            children: Vec::new(),
            pending: 1,
        };
        if self.nodes.insert(path.to_vec(), node).is_some() {
            self.broken = true;
        }
    }

    /// A child whose entry hash comes later ([`TreeBuilder::fulfil`]).
    pub fn expect(&mut self, path: &[u8]) {
        let (parent, _) = split_path(path);
        match self.nodes.get_mut(parent) {
            Some(n) => n.pending += 1,
            None => self.broken = true,
        }
    }

    /// A child whose entry hash is known now (a symlink, or a file hashed during the walk).
    pub fn add(&mut self, path: &[u8], entry: Hash) {
        self.expect(path);
        self.fulfil(path, entry);
    }

    /// The entry hash of an expected child.
    pub fn fulfil(&mut self, path: &[u8], entry: Hash) {
        let (parent, name) = split_path(path);
        let Some(node) = self.nodes.get_mut(parent) else {
            self.broken = true;
            return;
        };
        node.children.push((name.into(), entry));
        // The parent path is copied only when the directory is complete.
        match node.pending.checked_sub(1) {
            Some(p) => node.pending = p,
            None => {
                self.broken = true;
                return;
            }
        }
        if node.pending == 0 {
            self.settle(parent.to_vec(), false);
        }
    }

    /// Everything in directory `path` (`""` = the root) was reported.
    pub fn close_dir(&mut self, path: &[u8]) {
        self.settle(path.to_vec(), true);
    }

    /// Counts one pending item of `dir` as done and hashes every directory that became complete,
    /// upwards.
    fn settle(&mut self, mut dir: Vec<u8>, mut one_done: bool) {
        loop {
            let Some(node) = self.nodes.get_mut(&dir) else {
                self.broken = true;
                return;
            };
            if one_done {
                match node.pending.checked_sub(1) {
                    Some(p) => node.pending = p,
                    None => {
                        self.broken = true;
                        return;
                    }
                }
            }
            if node.pending > 0 {
                return;
            }
            let Some(mut node) = self.nodes.remove(&dir) else {
                return;
            };
            node.children
                .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut listing = Listing::default();
            for (name, h) in &node.children {
                listing.add(name, h);
            }
            let listing = listing.finish();
            if dir.is_empty() {
                self.root = Some(listing);
                return;
            }
            let entry = dir_entry(&listing);
            let (parent, name) = split_path(&dir);
            let (parent, name) = (parent.to_vec(), name.to_vec());
            let Some(p) = self.nodes.get_mut(&parent) else {
                self.broken = true;
                return;
            };
            p.children.push((name.into(), entry));
            dir = parent;
            one_done = true;
        }
    }

    /// The root's listing hash, once every directory is complete.
    pub fn root(&self) -> Option<Hash> {
        if self.broken { None } else { self.root }
    }

    /// Directories still waiting (for diagnostics).
    pub fn open_dirs(&self) -> usize {
        self.nodes.len()
    }
}
