//! One `send` command, several receivers (`--connect` repeated): every receiver gets the tree
//! and its own summary, each block of the source is read once for all of them, the sessions
//! start sending together, and a receiver that cannot be reached fails alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A `receive --once` on a free loopback port, with a block store of its own under `store`
/// (so the sender announces blocks: the reads it shares), its bound address and its stdout
/// (kept open: it prints its summary there at the end).
fn receiver(pki: &Pki, dst: &Path, store: &Path) -> (Child, String, BufReader<ChildStdout>) {
    let mut child = Command::new(BIN)
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--json",
            "--cas",
        ])
        .arg(store)
        .arg("--root")
        .arg(dst)
        .args(pki.args("receiver"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (addr, stdout) = bound_addr(&mut child);
    (child, addr, stdout)
}

fn send_to(pki: &Pki, src: &Path, addrs: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["send", "--json", "--log-level", "info", "--streams", "2"]);
    for a in addrs {
        cmd.args(["--connect", a]);
    }
    cmd.arg("--root")
        .arg(src)
        .args(pki.args("sender"))
        .output()
        .unwrap()
}

/// The summaries on stdout, by destination.
fn summaries(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Three large files of 5 full blocks and a tail each, beside small files: 15 full blocks.
fn dataset(root: &Path) -> u64 {
    for i in 0..20u64 {
        write(&root.join(format!("small/{i}.txt")), &random_bytes(3000, i));
    }
    for i in 0..3u64 {
        write(
            &root.join(format!("big/{i}.bin")),
            &random_bytes(5 * 4 * 1024 * 1024 + 1000, 40 + i),
        );
    }
    15
}

/// "N blocks read from the source for D destinations (M taken from another destination's
/// read)" from the sender's log: (N, M).
fn shared_reads(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.contains("blocks read from the source"))
        .unwrap_or_else(|| panic!("no count of shared reads in the sender's log:\n{stderr}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let at = |i: usize| *numbers.iter().rev().nth(i).unwrap();
    // The last three numbers: reads, destinations, shared.
    (at(2), at(0))
}

#[test]
fn one_send_reaches_every_receiver_and_reads_each_block_once() {
    let pki = pki("fan-cli");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let blocks = dataset(&src);
    let mut receivers = Vec::new();
    for i in 0..3 {
        let (dst, store) = (
            tmp.path().join(format!("d{i}")),
            tmp.path().join(format!("s{i}")),
        );
        std::fs::create_dir_all(&dst).unwrap();
        let (child, addr, stdout) = receiver(&pki, &dst, &store);
        receivers.push((child, addr, dst, stdout));
    }
    let owned: Vec<String> = receivers.iter().map(|(_, a, _, _)| a.clone()).collect();
    let addrs: Vec<&str> = owned.iter().map(String::as_str).collect();
    let out = send_to(&pki, &src, &addrs);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "send failed: {:?}\n{stderr}",
        out.status
    );
    for (mut child, _, dst, _stdout) in receivers {
        assert!(child.wait().unwrap().success(), "a receiver failed");
        assert_same_tree(&src, &dst);
    }
    let lines = summaries(&out);
    let named: Vec<&str> = lines
        .iter()
        .map(|l| l["destination"].as_str().expect("destination"))
        .collect();
    assert_eq!(
        named, addrs,
        "one summary per destination, in --connect order"
    );
    let digests: Vec<&str> = lines
        .iter()
        .map(|l| l["digest"].as_str().unwrap())
        .collect();
    assert!(
        !digests[0].is_empty() && digests.iter().all(|d| *d == digests[0]),
        "every destination verified the same digest: {digests:?}"
    );
    assert_eq!(
        shared_reads(&stderr),
        (blocks, 2 * blocks),
        "each full block is read once for the three destinations"
    );
}

#[test]
fn a_receiver_that_cannot_be_reached_fails_alone() {
    let pki = pki("fan-cli-down");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    dataset(&src);
    let dst = tmp.path().join("dst");
    std::fs::create_dir_all(&dst).unwrap();
    let (mut child, addr, _stdout) = receiver(&pki, &dst, &tmp.path().join("store"));
    // A port nothing listens on: bound, then closed.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let out = send_to(&pki, &src, &[&down, &addr]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        child.wait().unwrap().success(),
        "the reachable receiver failed"
    );
    assert_same_tree(&src, &dst);
    let code = out.status.code().expect("an exit status");
    assert_eq!(
        code,
        i32::from(ferry_mover::kind::exit_status(
            ferry_mover::kind::ErrorKind::Network,
            false
        )),
        "the unreachable destination's failure is the exit status:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("to {down}:")),
        "the failure names the destination:\n{stderr}"
    );
    let lines = summaries(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["destination"], addr.as_str());
}

#[test]
fn a_receiver_named_twice_is_refused_before_anything_is_sent() {
    let pki = pki("fan-cli-twice");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    dataset(&src);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (a, b) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{port}"));
    let out = send_to(&pki, &src, &[&a, &b]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--connect {b} names the same receiver as --connect {a}"
        )),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no summary: nothing was sent");
}

/// A TCP relay on a free loopback port in front of `target` that holds every connection until
/// `hold` after its first one (a destination whose handshakes the sender cannot finish at
/// once). Counts the bytes relayed towards `target`, and notes what `watched` counted when it
/// let the first connection through.
struct Relay {
    addr: String,
    towards_target: Arc<AtomicU64>,
    watched_at_release: Arc<OnceLock<u64>>,
}

fn relay(target: String, hold: Duration, watched: Arc<AtomicU64>) -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let towards_target = Arc::new(AtomicU64::new(0));
    let watched_at_release = Arc::new(OnceLock::new());
    let first = Arc::new(OnceLock::new());
    let (count, noted) = (towards_target.clone(), watched_at_release.clone());
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let first: Instant = *first.get_or_init(Instant::now);
            let (target, count) = (target.clone(), count.clone());
            let (noted, watched) = (noted.clone(), watched.clone());
            std::thread::spawn(move || {
                // The hold is the scenario itself (a slow destination), not a wait for a result.
                std::thread::sleep((first + hold).saturating_duration_since(Instant::now()));
                noted.get_or_init(|| watched.load(Ordering::SeqCst));
                let server = TcpStream::connect(&target).unwrap();
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(s2, c2, None));
                pipe(client, server, Some(&count));
            });
        }
    });
    Relay {
        addr,
        towards_target,
        watched_at_release,
    }
}

/// Copies `from` to `to` until either ends, counting into `count`.
fn pipe(mut from: TcpStream, mut to: TcpStream, count: Option<&AtomicU64>) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(c) = count {
            c.fetch_add(n as u64, Ordering::SeqCst);
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[test]
fn no_destination_gets_data_before_every_destination_is_greeted() {
    let pki = pki("fan-cli-gate");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    dataset(&src);
    let (da, db) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&da).unwrap();
    std::fs::create_dir_all(&db).unwrap();
    let (mut ra, addr_a, _oa) = receiver(&pki, &da, &tmp.path().join("sa"));
    let (mut rb, addr_b, _ob) = receiver(&pki, &db, &tmp.path().join("sb"));
    let to_a = relay(addr_a, Duration::ZERO, Arc::default());
    // What reached a when b's connections were let through: b could not be greeted before.
    let to_b = relay(addr_b, Duration::from_secs(2), to_a.towards_target.clone());
    let out = send_to(&pki, &src, &[&to_a.addr, &to_b.addr]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(ra.wait().unwrap().success() && rb.wait().unwrap().success());
    assert_same_tree(&src, &da);
    assert_same_tree(&src, &db);
    // Two streams' TLS handshakes and Hellos are a few KiB; the tree is 60 MiB.
    let sent_to_a = *to_b
        .watched_at_release
        .get()
        .expect("b's connections were let through");
    assert!(
        sent_to_a < 64 * 1024,
        "{sent_to_a} bytes reached a while b was still being greeted"
    );
}
