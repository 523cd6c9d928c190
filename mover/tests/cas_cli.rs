//! `ferry-mover cas ...` through the real binary, including a writer SIGKILLed mid-insert and gc
//! running in another process while this one holds a lease.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ferry_mover::cas::{BLOCK_SIZE, BlockHash, CasStore};
use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry-mover"))
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn cas(args: &[&str], dir: &Path) -> Output {
    let mut cmd = bin();
    cmd.arg("cas").arg(args[0]).arg(dir).args(&args[1..]);
    cmd.output().unwrap()
}

fn json(out: &Output) -> Value {
    assert!(
        out.stderr.is_empty() || out.status.code().is_some(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn block_files(store: &Path) -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = fs::read_dir(d) {
            for e in rd {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&store.join("blocks"), &mut out);
    out
}

/// Imports `n` distinct full blocks (plus a tail that must not be stored) through the binary.
fn import(store: &Path, work: &Path, name: &str, seed: u64, n: usize) -> Vec<Vec<u8>> {
    let blocks: Vec<Vec<u8>> = (0..n).map(|i| data(seed + i as u64, BLOCK_SIZE)).collect();
    let mut file = blocks.concat();
    file.extend_from_slice(&data(seed + 1000, 12345));
    let path = work.join(name);
    fs::write(&path, &file).unwrap();
    let out = bin()
        .args(["cas", "import", "--json"])
        .arg(store)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["blocks"], n as u64);
    blocks
}

#[test]
fn stats_verify_gc_through_the_binary() {
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    let blocks = import(&store, work.path(), "f", 1, 3);

    let v = json(&cas(&["stats", "--json"], &store));
    assert_eq!(v["blocks"], 3);
    assert_eq!(v["bytes"], 3 * BLOCK_SIZE as u64);
    assert!(v["cap_bytes"].is_null());
    assert!(v["oldest_access_unix"].as_u64().unwrap() <= v["newest_access_unix"].as_u64().unwrap());
    let human = cas(&["stats"], &store);
    assert!(String::from_utf8_lossy(&human.stdout).contains("blocks: 3"));

    let out = cas(&["verify", "--json"], &store);
    assert!(out.status.success());
    let v = json(&out);
    assert_eq!(v["blocks_checked"], 3);
    assert_eq!(v["bad_blocks_discarded"], 0);

    // Flip one byte in one stored block: verify finds it, discards it, exits 1.
    let victim = BlockHash::of(&blocks[1]);
    let files = block_files(&store);
    let path = files
        .iter()
        .find(|p| p.file_name().unwrap().to_str().unwrap() == victim.to_hex())
        .unwrap();
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&[blocks[1][4_000_000] ^ 1], 4_000_000)
        .unwrap();
    drop(f);
    let out = cas(&["verify", "--json"], &store);
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    assert_eq!(v["bad_blocks_discarded"], 1);
    assert_eq!(v["bad_hashes"][0], victim.to_hex());
    assert!(!path.exists());
    assert_eq!(block_files(&store).len(), 2);

    // gc down to one block evicts the least recently used.
    let out = cas(&["gc", "--json", "--cap", &BLOCK_SIZE.to_string()], &store);
    assert!(out.status.success());
    let v = json(&out);
    assert_eq!(v["blocks_evicted"], 1);
    assert_eq!(v["bytes_after"], BLOCK_SIZE as u64);
    assert_eq!(v["reached_target"], true);

    // Not a store: a clear error, non-zero exit.
    let out = cas(&["stats"], work.path());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a ferry block store"));
}

#[test]
fn torn_block_of_a_killed_writer_is_never_visible_and_is_cleaned() {
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    let _ = import(&store, work.path(), "seed", 10, 1);
    let src = work.path().join("big");
    let payload = data(20, BLOCK_SIZE);
    fs::write(&src, &payload).unwrap();
    let hash = BlockHash::of(&payload);

    let mut child = bin()
        .args(["cas", "import", "--test-stall-mid-insert"])
        .arg(&store)
        .arg(&src)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let temp = PathBuf::from(line.trim().strip_prefix("STALLED ").unwrap());
    assert!(temp.starts_with(store.join("tmp")));
    assert_eq!(fs::metadata(&temp).unwrap().len(), BLOCK_SIZE as u64 / 2);

    // While the writer lives, its temp is protected from cleaners and invisible to readers.
    let v = json(&cas(&["gc", "--json"], &store));
    assert_eq!(v["stale_temps_removed"], 0);
    assert!(temp.exists());
    let opened = CasStore::open_existing(&store).unwrap();
    assert!(opened.lookup(&hash).unwrap().is_none());
    assert!(temp.exists(), "open must not remove a live writer's temp");

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        temp.exists(),
        "the torn temp is left behind by the dead writer"
    );
    assert!(opened.lookup(&hash).unwrap().is_none());
    assert!(opened.read_verified(&hash).unwrap().is_none());
    assert_eq!(
        block_files(&store).len(),
        1,
        "only the seed block is published"
    );

    // The next gc (or open) removes it.
    let v = json(&cas(&["gc", "--json"], &store));
    assert_eq!(v["stale_temps_removed"], 1);
    assert!(!temp.exists());
    assert_eq!(fs::read_dir(store.join("tmp")).unwrap().count(), 0);
    let v = json(&cas(&["verify", "--json"], &store));
    assert_eq!(v["bad_blocks_discarded"], 0);
    assert_eq!(v["blocks_checked"], 1);

    // Second torn writer, cleaned by a plain open this time.
    let mut child = bin()
        .args(["cas", "import", "--test-stall-mid-insert"])
        .arg(&store)
        .arg(&src)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let temp = PathBuf::from(line.trim().strip_prefix("STALLED ").unwrap());
    child.kill().unwrap();
    child.wait().unwrap();
    let _reopened = CasStore::open_existing(&store).unwrap();
    assert!(!temp.exists());
}

#[test]
fn gc_in_another_process_spares_blocks_pinned_by_a_lease_here() {
    let work = tempfile::tempdir().unwrap();
    let store_dir = work.path().join("store");
    let blocks = import(&store_dir, work.path(), "f", 40, 6);
    let store = CasStore::open_existing(&store_dir).unwrap();
    // Make the order explicit: block 0 oldest ... block 5 newest.
    for (i, b) in blocks.iter().enumerate() {
        let f = fs::File::open(store.block_path(&BlockHash::of(b))).unwrap();
        f.set_modified(
            std::time::SystemTime::now() - std::time::Duration::from_secs(600 - 60 * i as u64),
        )
        .unwrap();
    }
    let lease = store.lease("active").unwrap();
    lease
        .pin(&[BlockHash::of(&blocks[0]), BlockHash::of(&blocks[2])])
        .unwrap();

    let cap = 3 * BLOCK_SIZE as u64;
    let v = json(&cas(
        &["gc", "--json", "--cap", &cap.to_string()],
        &store_dir,
    ));
    assert_eq!(v["blocks_evicted"], 3, "{v}");
    assert_eq!(v["live_leases"], 1);
    let present: Vec<bool> = blocks
        .iter()
        .map(|b| store.lookup(&BlockHash::of(b)).unwrap().is_some())
        .collect();
    // Pinned 0 and 2 survive, unpinned LRU 1, 3, 4 go, newest 5 stays.
    assert_eq!(present, vec![true, false, true, false, false, true]);

    let v = json(&cas(&["stats", "--json"], &store_dir));
    assert_eq!(v["live_leases"], 1);
    drop(lease);
    let v = json(&cas(&["stats", "--json"], &store_dir));
    assert_eq!(v["live_leases"], 0);
}
