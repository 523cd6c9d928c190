//! The command line as people use it: `certs` never overwrites without `--force`; `--listen :PORT`
//! and `--connect HOST:PORT` with a host name; the transfer id taken from the certificate; the
//! bandwidth limit as a quantity with `0` for none; `--quiet`; completions and a man page.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

use common::*;

fn mover(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

#[test]
fn certs_refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let first = mover(&["certs", "--out", out, "--transfer", "t1"]);
    assert!(first.status.success(), "{first:?}");
    let key = std::fs::read(dir.path().join("sender.key")).unwrap();
    let again = mover(&["certs", "--out", out, "--transfer", "t2"]);
    assert_eq!(again.status.code(), Some(2));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("refusing to overwrite") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("sender.key")).unwrap(),
        key,
        "a refused run changed a key"
    );
    let forced = mover(&["certs", "--out", out, "--transfer", "t2", "--force"]);
    assert!(forced.status.success(), "{forced:?}");
    assert_ne!(std::fs::read(dir.path().join("sender.key")).unwrap(), key);
}

/// `:0` listens on every interface; the sender reaches it by host name; neither is told the
/// transfer id (each reads it from its certificate); `--bandwidth-limit 0` is no limit; `-q`
/// prints no summary.
#[test]
fn bare_port_host_name_id_from_certificate_and_zero_limit() {
    let pki = pki("cli-conv");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    for i in 0..5 {
        write(&src.join(format!("d/f{i}")), &random_bytes(100_000, i));
    }
    let without_transfer = |role: &str| {
        let mut a = pki.args(role);
        a.truncate(a.len() - 2);
        assert!(!a.iter().any(|x| x == "--transfer"));
        a
    };
    let mut recv = Command::new(BIN)
        .args(["receive", "--listen", ":0", "--once", "--root"])
        .arg(&dst)
        .args(without_transfer("receiver"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (line, _out) = bound_addr(&mut recv);
    let bound: std::net::SocketAddr = line.parse().unwrap();
    assert!(bound.ip().is_unspecified(), "{bound}");
    let send = Command::new(BIN)
        .args([
            "send",
            "-q",
            "--bandwidth-limit",
            "0",
            "--connect",
            &format!("localhost:{}", bound.port()),
            "--root",
        ])
        .arg(&src)
        .args(without_transfer("sender"))
        .output()
        .unwrap();
    let status = recv.wait().unwrap();
    assert!(send.status.success(), "{send:?}");
    assert!(status.success());
    assert!(
        send.stderr.is_empty(),
        "-q printed: {}",
        String::from_utf8_lossy(&send.stderr)
    );
    for i in 0..5 {
        let rel = format!("d/f{i}");
        assert_eq!(
            std::fs::read(dst.join(&rel)).unwrap(),
            std::fs::read(src.join(&rel)).unwrap()
        );
    }
}

#[test]
fn bandwidth_limits_are_quantities() {
    let pki = pki("cli-bw");
    let src = tempfile::tempdir().unwrap();
    let mut args = vec![
        "send",
        "--connect",
        "127.0.0.1:9",
        "--bandwidth-limit",
        "fast",
    ];
    args.push("--root");
    let root = src.path().to_str().unwrap().to_owned();
    args.push(&root);
    let tls = pki.args("sender");
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    args.extend(tls);
    let out = mover(&args);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a quantity of bytes per second"), "{err}");
}

#[test]
fn completions_and_man_page_come_from_the_cli_definition() {
    let bash = mover(&["completions", "bash"]);
    assert!(bash.status.success());
    let script = String::from_utf8_lossy(&bash.stdout);
    for word in [
        "ferry-mover",
        "send",
        "receive",
        "--bandwidth-limit",
        "clean-staging",
    ] {
        assert!(script.contains(word), "completion lacks {word}");
    }
    let man = mover(&["man"]);
    assert!(man.status.success());
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(page.contains(".TH ferry-mover 1"), "{page}");
    assert!(page.contains("completions"), "{page}");
}
