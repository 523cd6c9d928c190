//! Movers of two clusters: each side's CA vouches only for its own cluster's identities, a peer
//! cluster's CA (`--peer-ca`) only for that cluster's movers of the same transfer and attempt.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry_mover::net::{self, Ca, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TRANSFER: &str = "uid-east.1";

fn ca(cluster: &str) -> Ca {
    Ca::new_valid_for(&format!("cluster {cluster}"), 1, 1).unwrap()
}

/// The receiver of cluster `east` (attempt 2) and the sender of cluster `west`, each trusting
/// the other cluster's CA for that cluster's movers.
struct Pair {
    east_ca: Ca,
    west_ca: Ca,
    east: Pki,
    west: Pki,
}

fn pair() -> Pair {
    let (east_ca, west_ca) = (ca("east"), ca("west"));
    let east = Pki::scoped_for_peer(&east_ca, "east", "west", TRANSFER, 2);
    let west = Pki::scoped_for_peer(&west_ca, "west", "east", TRANSFER, 2);
    Pair {
        east_ca,
        west_ca,
        east,
        west,
    }
}

fn with_peer(files: net::TlsFiles, peer: &Pki, cluster: &str) -> net::TlsFiles {
    net::with_peer(files, &peer.ca_path(), cluster).unwrap()
}

/// A TLS handshake between a server and a client; the error text of each side.
async fn handshake(
    server: &net::TlsFiles,
    accepted: &[Role],
    client: &net::TlsFiles,
    client_accepts: &[Role],
) -> (Result<(), String>, Result<(), String>) {
    let server = Arc::new(net::server_config(server, accepted).unwrap());
    let client = Arc::new(net::client_config(client, client_accepts).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let srv = tokio::spawn(async move {
        let (tcp, a) = listener.accept().await.unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        match net::accept_tls(tcp, a, &acceptor, Duration::from_secs(5)).await {
            Ok(mut s) => {
                // TLS 1.3 checks the client's certificate after the client finished: read
                // to surface a late refusal, then answer so the client sees success.
                let mut b = [0u8; 1];
                match s.read_exact(&mut b).await {
                    Ok(_) => {
                        let _ = s.write_all(b"y").await;
                        let _ = s.shutdown().await;
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            Err(e) => Err(ferry_mover::session::error_chain(&e)),
        }
    });
    let cli = match net::connect_tls(addr, client, Duration::from_secs(5)).await {
        Ok(mut s) => {
            let _ = s.write_all(b"x").await;
            let mut b = [0u8; 1];
            match s.read_exact(&mut b).await {
                Err(e) => Err(e.to_string()),
                Ok(_) => Ok(()),
            }
        }
        Err(e) => Err(ferry_mover::session::error_chain(&e)),
    };
    (srv.await.unwrap(), cli)
}

#[test]
fn a_tree_moves_between_movers_of_two_clusters() {
    let p = pair();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    mixed_tree(&src);
    let east_ca = p.west.ca_path().display().to_string();
    let west_ca = p.east.ca_path().display().to_string();
    let (mut recv, addr, _out) = spawn_receiver(
        &p.east,
        &dst,
        &["--peer-ca", &east_ca, "--peer-cluster", "west"],
    );
    let sent = run_sender(
        &p.west,
        &src,
        &addr,
        &["--peer-ca", &west_ca, "--peer-cluster", "east"],
    );
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(recv.wait().unwrap().success());
    assert_same_tree(&src, &dst);
}

#[tokio::test]
async fn each_ca_vouches_only_for_its_own_cluster() {
    let p = pair();
    let receiver = with_peer(p.east.files(Role::Receiver), &p.west, "west");
    let sender = with_peer(p.west.files(Role::Sender), &p.east, "east");
    let (srv, cli) = handshake(&receiver, &[Role::Sender], &sender, &[Role::Receiver]).await;
    assert_eq!((srv, cli), (Ok(()), Ok(())));

    // West's CA mints a sender that claims to be east's own: east checks east's claims against
    // its own CA only, so the chain fails.
    let forged = Pki::scoped_for_peer(&p.west_ca, "east", "west", TRANSFER, 2);
    let forged_sender = with_peer(forged.files(Role::Sender), &p.west, "west");
    let (srv, _) = handshake(
        &receiver,
        &[Role::Sender],
        &forged_sender,
        &[Role::Receiver],
    )
    .await;
    assert!(srv.is_err(), "a peer CA minted a local identity");

    // A third cluster's sender signed by west's CA, or west's sender of another attempt.
    for (cluster, attempt) in [("north", 2), ("west", 1)] {
        let other = Pki::scoped_for_peer(&p.west_ca, cluster, "east", TRANSFER, attempt);
        let files = with_peer(other.files(Role::Sender), &p.east, "east");
        let (srv, _) = handshake(&receiver, &[Role::Sender], &files, &[Role::Receiver]).await;
        // Whichever side notices first (the honest client also refuses east's receiver of
        // another attempt) ends the handshake.
        assert!(srv.is_err(), "{cluster} attempt {attempt}: accepted");
    }

    // With a peer cluster, the sender must be that cluster's: east's own sender of the same
    // transfer and attempt is refused.
    let local = p.east.files(Role::Sender);
    let (srv, _) = handshake(&receiver, &[Role::Sender], &local, &[Role::Receiver]).await;
    assert!(srv.unwrap_err().contains("not allowed here"));

    // A receiver without --peer-ca refuses west's sender outright.
    let plain = p.east.files(Role::Receiver);
    let (srv, _) = handshake(&plain, &[Role::Sender], &sender, &[Role::Receiver]).await;
    assert!(srv.is_err());
}

#[tokio::test]
async fn a_peer_ca_never_vouches_for_an_operator() {
    let p = pair();
    // West's operator, with west's CA, asks east's receiver for progress: the progress port
    // accepts operators, but east trusts west's CA only for movers.
    let progress_server = with_peer(p.east.files(Role::Receiver), &p.west, "west");
    let dir = tempfile::tempdir().unwrap();
    let id = net::Identity::scoped_for_peer(TRANSFER, Role::Operator, "west", 2, "east").unwrap();
    let (cert, key) = p.west_ca.issue_for(&id).unwrap();
    std::fs::write(dir.path().join("o.crt"), cert).unwrap();
    std::fs::write(dir.path().join("o.key"), key).unwrap();
    let operator = net::load_files(
        &p.west.ca_path(),
        &dir.path().join("o.crt"),
        &dir.path().join("o.key"),
        TRANSFER,
        Role::Operator,
    )
    .unwrap();
    let operator = with_peer(operator, &p.east, "east");
    let (srv, _) = handshake(
        &progress_server,
        &[Role::Operator, Role::Sender],
        &operator,
        &[Role::Receiver],
    )
    .await;
    assert!(srv.unwrap_err().contains("not allowed here"));
    // East's own operator is still accepted.
    let local_op = Pki::scoped(&p.east_ca, "east", TRANSFER, 2);
    let id = net::Identity::scoped(TRANSFER, Role::Operator, "east", 2).unwrap();
    let (cert, key) = p.east_ca.issue_for(&id).unwrap();
    std::fs::write(local_op.path.join("o.crt"), cert).unwrap();
    std::fs::write(local_op.path.join("o.key"), key).unwrap();
    let files = net::load_files(
        &local_op.ca_path(),
        &local_op.path.join("o.crt"),
        &local_op.path.join("o.key"),
        TRANSFER,
        Role::Operator,
    )
    .unwrap();
    let (srv, cli) = handshake(
        &progress_server,
        &[Role::Operator],
        &files,
        &[Role::Receiver],
    )
    .await;
    assert_eq!((srv, cli), (Ok(()), Ok(())));
}

#[test]
fn peer_ca_needs_a_scoped_certificate_and_another_cluster() {
    let p = pair();
    let e = net::with_peer(p.east.files(Role::Receiver), &p.west.ca_path(), "east")
        .unwrap_err()
        .to_string();
    assert!(e.contains("own cluster"), "{e}");
    let plain = pki("t");
    let e = net::with_peer(plain.files(Role::Receiver), &p.west.ca_path(), "west")
        .unwrap_err()
        .to_string();
    assert!(e.contains("operator-issued"), "{e}");
    // A certificate for a session with another cluster, or with none, cannot take --peer-cluster.
    let local = Pki::scoped(&p.east_ca, "east", TRANSFER, 2);
    let e = net::with_peer(local.files(Role::Receiver), &p.west.ca_path(), "west")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not for a session with that cluster"), "{e}");
    let e = net::with_peer(p.east.files(Role::Receiver), &p.west.ca_path(), "north")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not for a session with that cluster"), "{e}");
}

/// A free port below the kernel's ephemeral range, so a client retrying it cannot end up
/// connected to itself (TCP simultaneous open needs its own source port to be the target).
fn free_port_below_ephemeral() -> u16 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let low: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
    (20000..low)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port")
}

#[test]
fn a_sender_with_connect_retry_waits_for_a_receiver_that_listens_late() {
    let p = pki("late");
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    mixed_tree(&src);
    let addr = format!("127.0.0.1:{}", free_port_below_ephemeral());
    let mut sender = std::process::Command::new(BIN)
        .args([
            "send",
            "--connect",
            &addr,
            "--connect-retry",
            "30",
            "--log-level",
            "info",
            "--root",
        ])
        .arg(&src)
        .args(p.args("sender"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Refused at least once: the sender says it keeps trying.
    let lines = stderr_lines(&mut sender);
    let mut log = String::new();
    assert!(
        wait_for_line(&lines, Duration::from_secs(10), &mut log, |l| l
            .contains("retrying in")),
        "the sender did not retry a refused connection: {log}"
    );
    let mut recv = std::process::Command::new(BIN)
        .args(["receive", "--listen", &addr, "--once", "--root"])
        .arg(&dst)
        .args(p.args("receiver"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = sender.wait().unwrap();
    log.extend(lines.iter().map(|l| l + "\n"));
    assert!(status.success(), "{log}");
    assert!(recv.wait().unwrap().success());
    assert_same_tree(&src, &dst);

    // Without it, a refused connection fails at once.
    let started = std::time::Instant::now();
    let out = run_sender(
        &p,
        &src,
        &format!("127.0.0.1:{}", free_port_below_ephemeral()),
        &[],
    );
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(5));
}
