//! One sender for several Transfers: its certificate names each one's identity, each receiver
//! accepts it for its own Transfer only, each connection of the sender is pinned to the receiver
//! of the Transfer it was opened for, and each Transfer's operator reads that Transfer's session
//! from the sender's progress port.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use ferry_mover::net::{self, Ca, Identity, Role, TlsFiles};
use ferry_mover::progress::{Phase, Progress, connect_progress, serve_progress_of_sessions};
use ferry_proto::progress::v1::ProgressRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CLUSTER: &str = "east";

/// Writes the certificate `ca` issues for `ids` (one leaf naming them all) into `dir` as
/// `name.crt`/`name.key` and loads it acting as the first.
fn issue(dir: &Path, ca: &Ca, name: &str, ids: &[Identity]) -> TlsFiles {
    std::fs::write(dir.join("ca.crt"), ca.cert_pem()).unwrap();
    let (cert, key) = ca.issue_for_all(ids).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    net::load_files(
        &dir.join("ca.crt"),
        &c,
        &k,
        &ids[0].transfer_id,
        ids[0].role,
    )
    .unwrap()
}

fn id(transfer: &str, role: Role, attempt: u32) -> Identity {
    Identity::scoped(transfer, role, CLUSTER, attempt).unwrap()
}

/// A TLS handshake of a receiver (server) and a sender (client) plus one byte each way: (the
/// server's verdict, the client's).
async fn handshake(
    server: &TlsFiles,
    client: &TlsFiles,
) -> (Result<(), String>, Result<(), String>) {
    handshake_as(server, Role::Sender, client, Role::Receiver).await
}

/// A TLS handshake where the server accepts `server_accepts` and the client `client_accepts`.
async fn handshake_as(
    server: &TlsFiles,
    server_accepts: Role,
    client: &TlsFiles,
    client_accepts: Role,
) -> (Result<(), String>, Result<(), String>) {
    let scfg = Arc::new(net::server_config(server, &[server_accepts]).unwrap());
    let ccfg = Arc::new(net::client_config(client, &[client_accepts]).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let srv = tokio::spawn(async move {
        let (tcp, a) = listener.accept().await.unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(scfg);
        match net::accept_tls(tcp, a, &acceptor, Duration::from_secs(5)).await {
            Ok(mut s) => {
                let mut b = [0u8; 1];
                match s.read(&mut b).await {
                    Ok(1) => {
                        let _ = s.write_all(b"y").await;
                        Ok(())
                    }
                    Ok(_) => Err("closed".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            }
            Err(e) => Err(ferry_mover::session::error_chain(&e)),
        }
    });
    let cli = match net::connect_tls(addr, ccfg, Duration::from_secs(5)).await {
        Ok(mut s) => {
            let _ = s.write_all(b"x").await;
            let mut b = [0u8; 1];
            match s.read(&mut b).await {
                Ok(1) => Ok(()),
                Ok(_) => Err("closed".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        }
        Err(e) => Err(ferry_mover::session::error_chain(&e)),
    };
    (srv.await.unwrap(), cli)
}

/// A CA in a fresh directory and the sender certificate it issues for attempt 1 of `a.1` and
/// attempt `b_attempt` of `b.1`.
fn sender_for_a_and_b(b_attempt: u32) -> (tempfile::TempDir, Ca, TlsFiles) {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster east", 1).unwrap();
    let ids = [
        id("a.1", Role::Sender, 1),
        id("b.1", Role::Sender, b_attempt),
    ];
    let sender = issue(dir.path(), &ca, "sender", &ids);
    (dir, ca, sender)
}

#[tokio::test]
async fn each_receiver_accepts_the_shared_sender_for_its_own_transfer_only() {
    let (dir, ca, sender) = sender_for_a_and_b(3);
    assert_eq!(sender.transfer_ids(), ["a.1", "b.1"]);
    let as_a = sender.acting_as("a.1").unwrap();
    let as_b = sender.acting_as("b.1").unwrap();
    assert_eq!(as_b.transfer_ids(), ["b.1", "a.1"]);
    assert!(sender.acting_as("c.1").is_none());

    let receiver_a = issue(dir.path(), &ca, "ra", &[id("a.1", Role::Receiver, 1)]);
    let receiver_b = issue(dir.path(), &ca, "rb", &[id("b.1", Role::Receiver, 3)]);
    for (receiver, acting) in [(&receiver_a, &as_a), (&receiver_b, &as_b)] {
        let (srv, cli) = handshake(receiver, acting).await;
        assert!(srv.is_ok() && cli.is_ok(), "{srv:?} {cli:?}");
    }

    // Pinned per connection: acting as a, the sender refuses b's receiver (though b's receiver
    // would accept it), and names what it expected.
    let (_, cli) = handshake(&receiver_b, &as_a).await;
    let e = cli.expect_err("the sender acting as a accepted b's receiver");
    assert!(
        e.contains("transfer:b.1:attempt:3:role:receiver")
            && e.contains("transfer:a.1:attempt:1:role:receiver"),
        "{e}"
    );

    // A Transfer the certificate does not name, or another attempt of one it names: the
    // receiver refuses it. (The receiver is the client here, so that its verdict comes first:
    // in TLS 1.3 the client checks the server before the server sees the client's certificate.)
    for (name, other) in [
        ("rc", id("c.1", Role::Receiver, 1)),
        ("ra2", id("a.1", Role::Receiver, 2)),
    ] {
        let receiver = issue(dir.path(), &ca, name, &[other]);
        let (_, cli) = handshake_as(&as_a, Role::Receiver, &receiver, Role::Sender).await;
        let e = cli.expect_err(name);
        assert!(
            e.contains("transfer:a.1:attempt:1:role:sender") && e.contains("accepts only"),
            "{name}: {e}"
        );
    }
}

#[test]
fn a_certificate_speaks_for_one_role_of_one_cluster() {
    let ca = Ca::new("cluster east", 1).unwrap();
    let mixed = [
        [id("a.1", Role::Sender, 1), id("a.1", Role::Receiver, 1)],
        [
            id("a.1", Role::Sender, 1),
            Identity::scoped("b.1", Role::Sender, "west", 1).unwrap(),
        ],
        [
            id("a.1", Role::Sender, 1),
            Identity::scoped_for_peer("b.1", Role::Sender, CLUSTER, 1, "west").unwrap(),
        ],
    ];
    for ids in mixed {
        let e = ca.issue_for_all(&ids).unwrap_err().to_string();
        assert!(e.contains("different roles or clusters"), "{e}");
    }
    assert!(ca.issue_for_all(&[]).is_err());
}

#[tokio::test]
async fn each_transfers_operator_reads_its_own_session_from_the_progress_port() {
    let (dir, ca, sender) = sender_for_a_and_b(2);
    let total = Arc::new(Progress::new("a.1", "sender"));
    let a = Progress::for_session_as(&total, "a.1");
    let b = Progress::for_session_as(&total, "b.1");
    a.bytes_done.store(100, Ordering::Relaxed);
    b.bytes_done.store(200, Ordering::Relaxed);
    total.bytes_done.store(300, Ordering::Relaxed);
    b.set_phase(Phase::Succeeded);
    let sessions = BTreeMap::from([("a.1".to_owned(), a), ("b.1".to_owned(), b.clone())]);
    let tls = Arc::new(net::server_config(&sender, &[Role::Operator]).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_progress_of_sessions(listener, tls, total, sessions));

    let operator = |name: &str, transfer: &str, attempt: u32| {
        let files = issue(
            dir.path(),
            &ca,
            name,
            &[id(transfer, Role::Operator, attempt)],
        );
        Arc::new(net::client_config(&files, &[Role::Sender]).unwrap())
    };
    let read = |tls| async move {
        let mut c = connect_progress(addr, tls)
            .await
            .map_err(|e| e.to_string())?;
        c.get(ProgressRequest { interval_ms: 100 })
            .await
            .map(|r| r.into_inner())
            .map_err(|e| e.to_string())
    };
    let of_a = read(operator("oa", "a.1", 1)).await.unwrap();
    assert_eq!((of_a.transfer_id.as_str(), of_a.bytes_done), ("a.1", 100));
    let of_b = read(operator("ob", "b.1", 2)).await.unwrap();
    assert_eq!((of_b.transfer_id.as_str(), of_b.bytes_done), ("b.1", 200));
    assert_eq!(
        of_b.phase,
        ferry_proto::progress::v1::Phase::Succeeded as i32
    );
    // b's outcome reached its operator; a's has not ended.
    b.linger_for_watchers(Duration::from_secs(5)).await;

    // The operator of another Transfer, or of another attempt of b, reads nothing.
    for (name, transfer, attempt) in [("oc", "c.1", 1), ("ob1", "b.1", 1)] {
        assert!(
            read(operator(name, transfer, attempt)).await.is_err(),
            "{name} read the progress port"
        );
    }
}

/// A `receive --once` for `transfer` (its own certificate) on a free loopback port.
fn receiver(dir: &Path, ca: &Ca, transfer: &str, dst: &Path) -> (Child, String) {
    issue(dir, ca, transfer, &[id(transfer, Role::Receiver, 1)]);
    let mut child = Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--once", "--json"])
        .arg("--root")
        .arg(dst)
        .arg("--ca")
        .arg(dir.join("ca.crt"))
        .arg("--cert")
        .arg(dir.join(format!("{transfer}.crt")))
        .arg("--key")
        .arg(dir.join(format!("{transfer}.key")))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (addr, _stdout) = bound_addr(&mut child);
    (child, addr)
}

#[test]
fn one_send_acts_as_each_destinations_transfer() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = Ca::new("cluster east", 1).unwrap();
    let src = tmp.path().join("src");
    for i in 0..30u64 {
        write(&src.join(format!("f/{i}.bin")), &random_bytes(40_000, i));
    }
    issue(
        &certs,
        &ca,
        "sender",
        &[id("a.1", Role::Sender, 1), id("b.1", Role::Sender, 1)],
    );
    let send = |connect: &[String]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["send", "--json", "--streams", "2"]);
        for c in connect {
            cmd.args(["--connect", c]);
        }
        cmd.arg("--root")
            .arg(&src)
            .arg("--ca")
            .arg(certs.join("ca.crt"))
            .arg("--cert")
            .arg(certs.join("sender.crt"))
            .arg("--key")
            .arg(certs.join("sender.key"))
            .output()
            .unwrap()
    };

    let (dst_a, dst_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let (mut ra, addr_a) = receiver(&certs, &ca, "a.1", &dst_a);
    let (mut rb, addr_b) = receiver(&certs, &ca, "b.1", &dst_b);
    // b's receiver first: each session opens its own connections.
    let out = send(&[format!("b.1@{addr_b}"), format!("a.1@{addr_a}")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(ra.wait().unwrap().success() && rb.wait().unwrap().success());
    assert_same_tree(&src, &dst_a);
    assert_same_tree(&src, &dst_b);

    // Without naming the Transfers, the sender acts as its first identity (a.1) everywhere:
    // b's receiver refuses it, a's gets the tree.
    let (dst_a2, dst_b2) = (tmp.path().join("a2"), tmp.path().join("b2"));
    let (mut ra, addr_a) = receiver(&certs, &ca, "a.1", &dst_a2);
    let (mut rb, addr_b) = receiver(&certs, &ca, "b.1", &dst_b2);
    let out = send(&[addr_a.clone(), addr_b.clone()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("to {addr_b}:")), "{stderr}");
    assert!(ra.wait().unwrap().success());
    assert_same_tree(&src, &dst_a2);
    let _ = rb.kill();
    let _ = rb.wait();

    // A Transfer the certificate does not speak for: refused before anything is sent.
    let out = send(&[format!("c.1@{addr_a}")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("does not speak for transfer \"c.1\" (it names a.1, b.1)"),
        "{stderr}"
    );

    // The same Transfer twice (its operator could read only one of the two sessions): refused
    // before anything is sent, even when the addresses differ.
    let out = send(&[format!("a.1@{addr_a}"), format!("a.1@{addr_b}")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--connect a.1@{addr_b} names transfer \"a.1\" again (as --connect a.1@{addr_a})"
        )),
        "{stderr}"
    );
}
