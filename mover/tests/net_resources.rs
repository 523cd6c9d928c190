//! Peak memory of both ends stays bounded whatever the file size or count: a tree larger than
//! the bound goes through the binary while VmHWM of both processes is sampled from /proc.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;

const BOUND_KIB: u64 = 192 * 1024;

fn watch(pid: u32, stop: Arc<AtomicBool>) -> (std::thread::JoinHandle<()>, Arc<AtomicU64>) {
    let peak = Arc::new(AtomicU64::new(0));
    let p = peak.clone();
    let h = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Some(v) = proc_status_kib(pid, "VmHWM") {
                p.fetch_max(v, Ordering::Relaxed);
            }
            // The memory sampler's interval (what is measured), not synchronization.
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    (h, peak)
}

#[test]
fn peak_rss_of_both_ends_is_bounded() {
    let pki = pki("rss");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    // 320 MiB in one file (more than the bound) plus 20 000 small files.
    {
        let mut f = std::fs::File::create(src.path().join("huge.bin")).unwrap();
        for i in 0..40 {
            f.write_all(&random_bytes(8 * 1024 * 1024, i + 100))
                .unwrap();
        }
    }
    for d in 0..20 {
        for i in 0..1000 {
            write(
                &src.path().join(format!("d{d:02}/f{i:04}")),
                format!("small file {d} {i}\n").repeat(8).as_bytes(),
            );
        }
    }
    let mut recv = Command::new(BIN)
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--json",
            "--root",
        ])
        .arg(dst.path())
        .args(pki.args("receiver"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _out) = bound_addr(&mut recv);
    let stop = Arc::new(AtomicBool::new(false));
    let (rw, rpeak) = watch(recv.id(), stop.clone());
    let send = Command::new(BIN)
        .args([
            "send",
            "--connect",
            addr.trim(),
            "--streams",
            "4",
            "--json",
            "--root",
        ])
        .arg(src.path())
        .args(pki.args("sender"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (sw, speak) = watch(send.id(), stop.clone());
    let so = send.wait_with_output().unwrap();
    assert!(so.status.success());
    assert!(recv.wait().unwrap().success());
    stop.store(true, Ordering::Relaxed);
    rw.join().unwrap();
    sw.join().unwrap();
    let (r, s) = (rpeak.load(Ordering::Relaxed), speak.load(Ordering::Relaxed));
    eprintln!("peak RSS: receiver {r} KiB, sender {s} KiB (bound {BOUND_KIB} KiB)");
    assert!(r > 0 && s > 0, "no samples");
    assert!(r < BOUND_KIB, "receiver peak RSS {r} KiB");
    assert!(s < BOUND_KIB, "sender peak RSS {s} KiB");
    let sum: serde_json::Value = serde_json::from_slice(&so.stdout).unwrap();
    assert_eq!(sum["files"], 20_001);
    assert_eq!(
        std::fs::metadata(dst.path().join("huge.bin"))
            .unwrap()
            .len(),
        320 * 1024 * 1024
    );
}
